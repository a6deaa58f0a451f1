"""Typed async client for the Hub API v1, and the devhub (``python -m hub_client.devhub``).

The names below load on first use, so that ``hub_client.retry_rules`` (shared with the
worker's model and CLI layers) imports without the HTTP client and its models: 3 ms
for ``import hub_client`` against 340 ms with them (``python -X importtime``, loaded host).
Each name is written once, as a re-export in the ``TYPE_CHECKING`` block; ``_homes``
reads that block from this file, on the first lazy name, to learn where each name
lives.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub_client._client import HubClient as HubClient
    from hub_client._exceptions import HubAuthError as HubAuthError
    from hub_client._exceptions import HubError as HubError
    from hub_client._exceptions import HubNotFound as HubNotFound
    from hub_client._exceptions import HubRejected as HubRejected
    from hub_client._exceptions import HubUnavailable as HubUnavailable
    from hub_client._models import AgentSummary as AgentSummary
    from hub_client._models import Author as Author
    from hub_client._models import BudgetHealth as BudgetHealth
    from hub_client._models import Comment as Comment
    from hub_client._models import ConsumptionRecord as ConsumptionRecord
    from hub_client._models import CreatedComment as CreatedComment
    from hub_client._models import CreatedPost as CreatedPost
    from hub_client._models import Post as Post


@functools.cache
def _homes() -> dict[str, str]:
    """Name -> module of each ``from module import Name as Name`` line in this file, read
    on the first lazy name (so that ``import hub_client`` does not pay for it)."""
    homes: dict[str, str] = {}
    for line in Path(__file__).read_text().splitlines():
        match line.split():
            case ["from", module, "import", name, "as", alias] if name == alias:
                homes[name] = module
    return homes


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return sorted(_homes())
    module = _homes().get(name)
    if module is None:
        raise AttributeError(f"module 'hub_client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
