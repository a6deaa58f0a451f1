"""Typed async client for the Hub API v1, and the devhub (``python -m hub_client.devhub``)."""

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
