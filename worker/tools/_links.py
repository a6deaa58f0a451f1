"""One task's link to one MCP server, and what every kind of link shares.

A ``ServerLink`` is what ``McpToolbox`` knows of a server during a task: the tools it
listed and offers, the caller its calls go through (a session of the task's own, or a
``PooledSession`` on a pooled stdio server), and whether it was withdrawn and why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import mcp_types

from worker.logs import log_event
from worker.models import ToolSpec
from worker.tools._config import McpServerConfig
from worker.tools._tool_cache import tool_lists

SEPARATOR = "__"
# What the providers accept as a tool name (OpenAI's rule is the strictest).
_MODEL_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CLIENT_INFO = mcp_types.Implementation(name="hub-agent-worker", version="0.1.0")
_MAX_LIST_PAGES = 100


class ToolCaller(Protocol):
    """What a link calls a server through: an MCP ``Client`` or a ``PooledSession``."""

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        meta: mcp_types.RequestParamsMeta | None = None,
    ) -> mcp_types.CallToolResult: ...

    async def list_tools(self, *, cursor: str | None = None) -> mcp_types.ListToolsResult: ...


@dataclass(eq=False)
class ServerLink:
    """One server's connection for this task, owned by its runner task."""

    name: str
    config: McpServerConfig
    # Mapped tools the server listed, by the server's own tool name.
    listed: dict[str, ToolSpec] = field(default_factory=dict)
    offered: list[ToolSpec] = field(default_factory=list)
    client: ToolCaller | None = None
    down_reason: str | None = None
    # Whether a call already told the model that this server is gone.
    told: bool = False
    ready: anyio.Event = field(default_factory=anyio.Event)
    closing: anyio.Event = field(default_factory=anyio.Event)
    gone: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    # The HTTP status of an answer that refused the credentials it was sent (401, 403).
    refused_status: int | None = None

    @property
    def unavailable_message(self) -> str:
        return f"server {self.name!r} is unavailable; its tools were withdrawn for this task"

    @property
    def caches_tool_list(self) -> bool:
        """Whether its list may serve later tasks: a per-task stdio server is new every time."""
        return self.config.is_http or self.config.pool

    def take(self, tool: mcp_types.Tool, *, may_offer: Callable[[str, str], bool]) -> None:
        """Keep a listed tool the config maps; offer it if ``may_offer(name, required_grant)``."""
        required_grant = self.config.required_grant(tool.name)
        if required_grant is None:
            return
        name = f"{self.name}{SEPARATOR}{tool.name}"
        if not _MODEL_TOOL_NAME.match(name):
            log_event(
                "mcp_tool_not_offered",
                "warning",
                tool=name,
                reason="models accept only [A-Za-z0-9_-]{1,64}",
            )
            return
        spec = ToolSpec(
            name=name,
            description=tool.description or tool.title or "",
            input_schema=_canonical_schema(tool.input_schema),
        )
        self.listed[tool.name] = spec
        if may_offer(name, required_grant):
            self.offered.append(spec)

    def note_refusal(self, status: int) -> None:
        self.refused_status = status

    def failure_reason(self, exc: BaseException, worker_token: str | None) -> str:
        """Why it failed, for ``withdraw``: a refused credential named as such (the SDK says
        only "Server returned an error response"), else the innermost cause."""
        if self.refused_status is None:
            return describe_failure(exc)
        sent = self.config.credentials_sent(worker_token)
        return (
            f"the server refused {sent} (HTTP {self.refused_status}): "
            "a wrong or missing token, not a server fault"
        )

    def withdraw(self, reason: str) -> None:
        if self.down_reason is None:
            self.down_reason = reason
            log_event("mcp_server_withdrawn", "warning", server=self.name, reason=reason)
        self.closing.set()


async def server_tools(
    link: ServerLink, caller: ToolCaller, *, ttl_s: float
) -> tuple[mcp_types.Tool, ...]:
    """The server's whole tool list: from this process's cache when fresh, else asked for."""
    identity = link.config.identity(link.name) if link.caches_tool_list and ttl_s > 0 else None
    if identity is not None and (cached := tool_lists.get(identity, ttl_s=ttl_s)) is not None:
        return cached
    tools = await every_page(caller)
    if identity is not None:
        tool_lists.put(identity, tools)
    return tools


async def every_page(caller: ToolCaller) -> tuple[mcp_types.Tool, ...]:
    """The server's tool list, page after page (at most ``_MAX_LIST_PAGES``)."""
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        page = await caller.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tuple(tools)


def describe_failure(exc: BaseException) -> str:
    """The innermost first cause, as ``Class: message``, for logs and ``unavailable_servers``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _canonical_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every object's keys in sorted order: the same bytes on the wire in every
    process, whatever order the server wrote them in (a prompt cache keeps only a
    byte-identical prefix; JSON Schema gives key order no meaning)."""
    canonical: dict[str, Any] = json.loads(json.dumps(schema, sort_keys=True))
    return canonical
