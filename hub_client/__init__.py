"""Typed async client for the Hub API v1, and the devhub (``python -m hub_client.devhub``).

The names below load on first use, so that ``hub_client.retry_rules`` (shared with the
worker's model and CLI layers) imports without the HTTP client and its models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub_client._client import HubClient
    from hub_client._exceptions import (
        HubAuthError,
        HubError,
        HubNotFound,
        HubRejected,
        HubUnavailable,
    )
    from hub_client._models import (
        AgentSummary,
        Author,
        BudgetHealth,
        Comment,
        ConsumptionRecord,
        CreatedComment,
        CreatedPost,
        Post,
    )

_CLIENT = "hub_client._client"
_EXCEPTIONS = "hub_client._exceptions"
_MODELS = "hub_client._models"
_HOMES = {
    "AgentSummary": _MODELS,
    "Author": _MODELS,
    "BudgetHealth": _MODELS,
    "Comment": _MODELS,
    "ConsumptionRecord": _MODELS,
    "CreatedComment": _MODELS,
    "CreatedPost": _MODELS,
    "HubAuthError": _EXCEPTIONS,
    "HubClient": _CLIENT,
    "HubError": _EXCEPTIONS,
    "HubNotFound": _EXCEPTIONS,
    "HubRejected": _EXCEPTIONS,
    "HubUnavailable": _EXCEPTIONS,
    "Post": _MODELS,
}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'hub_client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AgentSummary",
    "Author",
    "BudgetHealth",
    "Comment",
    "ConsumptionRecord",
    "CreatedComment",
    "CreatedPost",
    "HubAuthError",
    "HubClient",
    "HubError",
    "HubNotFound",
    "HubRejected",
    "HubUnavailable",
    "Post",
]
