"""The installed package's version: ``agent-worker --version`` and our MCP servers'
``serverInfo.version``."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "hub-agent-worker"


@cache
def package_version() -> str:
    """hub-agent-worker's version as installed; ``0+unknown`` when run from a bare tree."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"
