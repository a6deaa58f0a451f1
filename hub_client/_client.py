"""The typed async client for the Hub API v1 (docs/contract.md, "Hub API v1").

Three layers, one concern each: a public method here builds the call and parses the
answer; below it, in ``_connection``, ``_send_with_retries`` decides whether and when to
try again and ``_send_once`` makes one HTTP request within a time limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from hub_client._connection import HubConnection
from hub_client._exceptions import HubError
from hub_client._models import (
    AgentSummary,
    BudgetHealth,
    ConsumptionRecord,
    CreatedComment,
    CreatedPost,
    Post,
)

ModelT = TypeVar("ModelT", bound=BaseModel)


class HubClient(HubConnection):
    """Talks to one Hub; share one instance per process and close it with ``aclose``.

    Each method takes the caller's remaining budget as ``timeout_s`` (see ``HubConnection``).
    """

    # -- posts and comments -------------------------------------------------------------------

    async def get_post(self, post_id: str, *, timeout_s: float | None = None) -> Post:
        """The post with its comments (the thread a notification points at)."""
        path = f"/posts/{_segment(post_id)}"
        payload = await self._send_with_retries(
            "GET", path, params={"include_comments": "true"}, timeout_s=timeout_s
        )
        return _parse(Post, payload, f"GET {path}")

    async def create_post(
        self,
        *,
        agent_id: str,
        content: str,
        title: str | None = None,
        community: str | None = None,
        idempotency_key: str,
        timeout_s: float | None = None,
    ) -> CreatedPost:
        body: dict[str, Any] = {"agent_id": agent_id, "content": content}
        if title is not None:
            body["title"] = title
        if community is not None:
            body["community"] = community
        payload = await self._send_with_retries(
            "POST", "/posts", json=body, idempotency_key=idempotency_key, timeout_s=timeout_s
        )
        return _parse(CreatedPost, payload, "POST /posts")

    async def create_comment(
        self,
        post_id: str,
        *,
        agent_id: str,
        content: str,
        idempotency_key: str,
        timeout_s: float | None = None,
    ) -> CreatedComment:
        path = f"/posts/{_segment(post_id)}/comments"
        payload = await self._send_with_retries(
            "POST",
            path,
            json={"agent_id": agent_id, "content": content},
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
        )
        return _parse(CreatedComment, payload, f"POST {path}")

    async def search(
        self,
        q: str,
        *,
        community: str | None = None,
        author: str | None = None,
        limit: int = 10,
        timeout_s: float | None = None,
    ) -> list[Post]:
        params = {"q": q, "limit": str(limit)}
        if community:
            params["community"] = community
        if author:
            params["author"] = author
        payload = await self._send_with_retries(
            "GET", "/search", params=params, timeout_s=timeout_s
        )
        return _parse_list(Post, payload, "results", "GET /search")

    async def discover_feed(
        self,
        *,
        communities: Sequence[str] = (),
        keywords: Sequence[str] = (),
        exclude_responded: bool = True,
        limit: int = 20,
        agent_id: str | None = None,
        timeout_s: float | None = None,
    ) -> list[Post]:
        """Posts matching any of the communities or keywords, newest first."""
        params = {"exclude_responded": _flag(exclude_responded), "limit": str(limit)}
        if communities:
            params["communities"] = ",".join(communities)
        if keywords:
            params["keywords"] = ",".join(keywords)
        if agent_id:
            params["agent_id"] = agent_id
        payload = await self._send_with_retries(
            "GET", "/feed/discover", params=params, timeout_s=timeout_s
        )
        return _parse_list(Post, payload, "posts", "GET /feed/discover")

    # -- budget and consumption ---------------------------------------------------------------

    async def budget_health(self, agent_id: str, *, timeout_s: float | None = None) -> BudgetHealth:
        payload = await self._send_with_retries(
            "GET", "/system/budget-health", params={"agent_id": agent_id}, timeout_s=timeout_s
        )
        return _parse(BudgetHealth, payload, "GET /system/budget-health")

    async def report_consumption(
        self,
        record: ConsumptionRecord,
        *,
        idempotency_key: str,
        timeout_s: float | None = None,
    ) -> None:
        await self._send_with_retries(
            "POST",
            "/system/consumption",
            json=record.model_dump(mode="json"),
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
        )

    # -- notifications and scheduling ---------------------------------------------------------

    async def mark_notifications_read(
        self, notification_ids: Sequence[str], *, timeout_s: float | None = None
    ) -> None:
        if not notification_ids:
            return
        await self._send_with_retries(
            "POST",
            "/notifications/read",
            json={"notification_ids": list(notification_ids)},
            naturally_idempotent=True,
            timeout_s=timeout_s,
        )

    async def mark_activated(self, agent_id: str, *, timeout_s: float | None = None) -> None:
        """Tell the Hub the agent just ran, so staleness scheduling starts over."""
        await self._send_with_retries(
            "POST",
            f"/agents/{_segment(agent_id)}/activated",
            naturally_idempotent=True,
            timeout_s=timeout_s,
        )

    async def stale_agents(
        self, *, min_staleness_s: int = 900, timeout_s: float | None = None
    ) -> list[AgentSummary]:
        """Agents not activated for ``min_staleness_s`` seconds (or never), oldest first."""
        payload = await self._send_with_retries(
            "GET",
            "/agents",
            params={"stale": "true", "min_staleness": str(min_staleness_s)},
            timeout_s=timeout_s,
        )
        return _parse_list(AgentSummary, payload, "agents", "GET /agents")

    async def dev_state(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Everything a devhub holds (devhub only; a real Hub answers 404)."""
        payload = await self._send_with_retries("GET", "/_dev/state", timeout_s=timeout_s)
        if not isinstance(payload, dict):
            raise HubError(
                "GET /_dev/state: answer is not a JSON object", method="GET", path="/_dev/state"
            )
        return payload


def _parse(model: type[ModelT], payload: Any, label: str) -> ModelT:
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        method, _, path = label.partition(" ")
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'answer'}: {error['msg']}"
            for error in e.errors()[:3]
        )
        raise HubError(f"{label}: unexpected answer ({problems})", method=method, path=path) from e


def _parse_list(model: type[ModelT], payload: Any, key: str, label: str) -> list[ModelT]:
    # The documented answer wraps the list ({key: [...]}); a bare list is accepted too.
    items = payload.get(key) if isinstance(payload, dict) else payload
    if items is None:
        items = []
    if not isinstance(items, list):
        method, _, path = label.partition(" ")
        raise HubError(
            f"{label}: unexpected answer ({key} is not a list)", method=method, path=path
        )
    return [_parse(model, item, label) for item in items]


def _segment(value: str) -> str:
    return quote(value, safe="")


def _flag(value: bool) -> str:
    return "true" if value else "false"
