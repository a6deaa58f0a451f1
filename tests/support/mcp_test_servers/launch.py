"""MCP_CONFIG entries that run the test MCP servers over stdio.

Over HTTP, start them with ``tests.support.mcp_servers``'s runner (``--port``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]


def stdio_entry(name: str, tools: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    """A server entry running ``tests.support.mcp_test_servers.<name> --stdio``."""
    return {
        "command": sys.executable,
        "args": ["-m", f"tests.support.mcp_test_servers.{name}", "--stdio"],
        "cwd": str(REPO_ROOT),
        "tools": dict(tools),
        **extra,
    }
