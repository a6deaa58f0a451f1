"""The Toolbox of MCP tools for one task: offer, resolve, call, withdraw dead servers.

``McpToolbox.open`` connects, concurrently, to the configured servers that hold
at least one tool the agent may use, lists their tools once, and offers each as
``<server>__<tool>``. What ``resolve`` answers for a name:

- None: unknown server, tool not in the config's map (or not listed by its
  server), tool of a server left out by the agent's ``servers``, a server that
  never started, or a dead server's tool once the model has been told the
  server is gone.
- ``NotAllowed``: the tool exists but the task's ``allowed_tools`` leaves it out.
- ``MissingGrant``: the tool is mapped but its grant is not covered (for a
  server not connected, because no tool of it is granted, the map is trusted).
- ``Granted`` otherwise.

A server that fails to start, or whose connection breaks, is withdrawn for the
rest of the task: ``offered()`` drops its tools and ``unavailable_servers``
says why. The first call that meets the withdrawal raises ``ToolServerDown``
("server 'web' is unavailable; its tools were withdrawn for this task"); after
that the tools resolve to None like any tool that is not offered.

Each server's connection lives in its own task, so one server's crash
neither cancels the caller nor leaks the others; stdio servers run in
their own session (process group) and are killed with it on every exit path.
A stdio server marked ``pool: true`` is the exception: it is the process's
(``worker.tools._pool``), used by this task and left running when it ends. So is a
first-party HTTP server's session in a worker process that runs several tasks at once
(``worker.tools._shared_sessions``): the worker's token is the same for every task, and
who calls goes in each call's ``_meta``. Tool lists of HTTP and pooled servers come from
the per-process cache (``worker.tools._tool_cache``) while fresh.

Credentials go per server (``McpServerConfig.http_headers``): the worker's
``MCP_AUTH_TOKEN`` and the task's signed capability only reach servers marked
``first_party``. Every call's ``_meta`` names the caller (``agent_id``,
``task_id``, ``idempotency_key``) and the call's ``deadline`` (epoch seconds);
first-party calls add ``capability``. A result larger than ``max_result_bytes``
is not read: the call fails with a message naming the tool.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import anyio.abc
import mcp_types
from mcp.client import Client, Transport
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from worker._process_loop import process_loop
from worker._spawn import SpawnHook, ignore_spawn
from worker._task_groups import background_task_group
from worker.exceptions import ToolFailed, ToolNotFound, ToolServerDown
from worker.logs import log_event
from worker.models import ToolSpec
from worker.tools._base import (
    CallContext,
    Granted,
    MissingGrant,
    NotAllowed,
    Resolution,
    ToolResult,
)
from worker.tools._config import McpConfig, McpServerConfig
from worker.tools._grants import EffectiveGrants
from worker.tools._links import CLIENT_INFO, SEPARATOR, ServerLink, ToolCaller, server_tools
from worker.tools._pool import stdio_pool
from worker.tools._results import result_text
from worker.tools._shared_sessions import SessionSettings, SharedSessionUnavailable, shared_sessions
from worker.tools._tool_cache import DEFAULT_TOOL_LIST_TTL_S, tool_lists
from worker.tools._transports import (
    OversizeNote,
    current_call_note,
    http_streams,
    result_too_large_message,
    stdio_streams,
)

# How a server says it no longer has a tool it listed (MCPServer: "Unknown tool: x").
_UNKNOWN_TOOL = re.compile(r"unknown tool", re.IGNORECASE)
# How long closing may take before the servers still open are cancelled (stdio
# children are then killed by their transport, whatever happens).
CLOSE_TIMEOUT_S = 5.0
DEFAULT_MAX_RESULT_BYTES = 4_000_000
CAPABILITY_PLACEHOLDER = "[capability]"

# The task's signed capability for the next call: the worker signs it again once the
# task's scope is known, so each call asks for the current one.
CapabilitySource = Callable[[], str | None]


def no_capability() -> str | None:
    """Calls carry no capability (no CAPABILITY_KEY: development mode)."""
    return None


def fixed_capability(token: str | None) -> CapabilitySource:
    """Every call carries ``token`` (a gateway holds the one its task was signed)."""
    return lambda: token


class McpToolbox:
    """MCP tools for one task behind the Toolbox protocol; create it with ``open``."""

    def __init__(
        self,
        config: McpConfig,
        *,
        grants: EffectiveGrants,
        allowed_tools: Collection[str] | None,
        servers: Collection[str] | None,
        auth_token: str | None,
        capability: CapabilitySource,
        max_result_bytes: int,
        connect_timeout_s: float,
        on_spawn: SpawnHook,
        tool_list_ttl_s: float,
        share_sessions: bool,
        concurrency: int,
    ) -> None:
        self._grants = grants
        self._allowed_tools = None if allowed_tools is None else frozenset(allowed_tools)
        self._auth_token = auth_token
        self._capability = capability
        # Every capability sent so far: a server that echoes one must not show it the model.
        self._sent_capabilities: set[str] = set()
        self._max_result_bytes = max_result_bytes
        self._connect_timeout_s = connect_timeout_s
        self._on_spawn = on_spawn
        self._tool_list_ttl_s = tool_list_ttl_s
        self._share_sessions = share_sessions and process_loop() is not None
        self._concurrency = concurrency
        # The servers this agent may use at all: the config, narrowed by the agent's list.
        self._servers = {
            name: server
            for name, server in config.servers.items()
            if not servers or name in servers
        }
        if unknown := sorted(set(servers or ()) - set(config.servers)):
            log_event("mcp_servers_unknown", "warning", servers=sorted(unknown))
        self._links: dict[str, ServerLink] = {}

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: McpConfig,
        *,
        grants: EffectiveGrants,
        allowed_tools: Collection[str] | None = None,
        servers: Collection[str] | None = None,
        auth_token: str | None = None,
        capability: CapabilitySource = no_capability,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        connect_timeout_s: float = 10.0,
        on_spawn: SpawnHook = ignore_spawn,
        tool_list_ttl_s: float = DEFAULT_TOOL_LIST_TTL_S,
        share_sessions: bool = False,
        concurrency: int = 1,
    ) -> AsyncIterator[McpToolbox]:
        """Connect for one task; every session and child process is closed on exit.

        ``allowed_tools`` (model-visible names; None: no narrowing) is the task's narrowing,
        ``servers`` the agent's ``mcp_servers`` (None or empty: all). ``auth_token``
        (``MCP_AUTH_TOKEN``) goes as ``Authorization: Bearer`` to first-party HTTP servers
        without credentials of their own; ``capability`` gives the task's signed capability
        for the ``_meta`` of every call to a first-party server. ``max_result_bytes`` bounds one
        answer. ``on_spawn`` gets the pid (= process group) of every stdio server started for
        this task (pooled servers are the pool's, not the task's, except in a forked job
        process, where the pool ends with the job). Tool lists of HTTP and
        pooled servers come from this process's cache when younger than ``tool_list_ttl_s``
        (0: always ask the server). ``share_sessions`` uses the process's session to each
        first-party HTTP server (``worker.tools._shared_sessions``) instead of one of this
        task's own, except in an rq job process; ``concurrency`` (WORKER_CONCURRENCY) sizes
        its connection pool.
        """
        toolbox = cls(
            config,
            grants=grants,
            allowed_tools=allowed_tools,
            servers=servers,
            auth_token=auth_token,
            capability=capability,
            max_result_bytes=max_result_bytes,
            connect_timeout_s=connect_timeout_s,
            on_spawn=on_spawn,
            tool_list_ttl_s=tool_list_ttl_s,
            share_sessions=share_sessions,
            concurrency=concurrency,
        )
        # Runners never raise: what the caller's block raises comes out as it was.
        async with background_task_group() as runners:
            try:
                await toolbox._connect_all(runners)
                yield toolbox
            finally:
                await toolbox._close_all(runners)

    # -- the Toolbox protocol ------------------------------------------------------------

    def offered(self) -> Sequence[ToolSpec]:
        return [
            spec
            for link in self._links.values()
            if link.down_reason is None
            for spec in link.offered
        ]

    def resolve(self, name: str) -> Resolution:
        server_name, separator, tool = name.partition(SEPARATOR)
        server = self._servers.get(server_name)
        if not separator or server is None:
            return None
        required_grant = server.required_grant(tool)
        if required_grant is None:
            return None
        link = self._links.get(server_name)
        # A server we did not connect to cannot tell us whether the tool exists: trust the map.
        exists = None if link is None or link.client is None else tool in link.listed
        strict = self._grants.strict
        if self._allowed_tools is not None and name not in self._allowed_tools:
            return None if exists is False else NotAllowed(name=name, strict=strict)
        if not self._grants.covers(required_grant):
            if exists is False:
                return None
            return MissingGrant(name=name, required_grant=required_grant, strict=strict)
        if link is None or not exists or (link.down_reason is not None and link.told):
            return None
        return Granted(spec=link.listed[tool], server=server_name)

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        server_name, _, tool = name.partition(SEPARATOR)
        link = self._links.get(server_name)
        if link is None or tool not in link.listed:
            raise ToolNotFound(f"tool {name} is not offered to this agent")
        client = link.client
        if link.down_reason is not None or client is None:
            raise self._server_down(link)
        meta = cast(mcp_types.RequestParamsMeta, self._meta(link, ctx))
        note = OversizeNote()
        current_call_note.set(note)
        try:
            with anyio.fail_after(ctx.timeout_s):
                result = await client.call_tool(tool, arguments, meta=meta)
        except TimeoutError as exc:
            raise ToolFailed(f"tool {name} timed out after {ctx.timeout_s:.1f} s") from exc
        except MCPError as exc:
            if note.oversized:
                message = result_too_large_message(note.max_bytes)
                raise ToolFailed(f"tool {name} failed: {message}") from exc
            if exc.code == CONNECTION_CLOSED:
                link.withdraw("the connection closed")
                raise self._server_down(link) from exc
            if exc.code == REQUEST_TIMEOUT:
                raise ToolFailed(f"tool {name} timed out after {ctx.timeout_s:.1f} s") from exc
            _forget_list_if_unknown(link, exc.message)
            raise ToolFailed(f"tool {name} failed: {self._scrub(exc.message)}") from exc
        except Exception as exc:
            # The runner may have lost the connection while this call was starting.
            if link.down_reason is not None:
                raise self._server_down(link) from exc
            raise ToolFailed(f"tool {name} failed: {type(exc).__name__}: {exc}") from exc
        content = result_text(result)
        if result.is_error:
            _forget_list_if_unknown(link, content)
        return ToolResult(content=self._scrub(content), is_error=result.is_error)

    def _meta(self, link: ServerLink, ctx: CallContext) -> dict[str, Any]:
        """The call's ``_meta``: the caller and deadline for all, the capability for ours."""
        deadline = time.time() + ctx.timeout_s
        if ctx.deadline_epoch is not None:
            deadline = min(deadline, ctx.deadline_epoch)
        meta = ctx.meta() | {"deadline": round(deadline, 3)}
        capability = self._capability() if link.config.first_party else None
        if capability is not None:
            self._sent_capabilities.add(capability)
            meta["capability"] = capability
        return meta

    def _scrub(self, text: str) -> str:
        """A server that echoes a capability back must not hand it to the model."""
        for capability in self._sent_capabilities:
            text = text.replace(capability, CAPABILITY_PLACEHOLDER)
        return text

    # -- what the worker reads ------------------------------------------------------------

    @property
    def unavailable_servers(self) -> Mapping[str, str]:
        """Servers withdrawn so far (never started, or lost mid-task), with the reason."""
        return {
            name: link.down_reason
            for name, link in self._links.items()
            if link.down_reason is not None
        }

    # -- connecting and closing -----------------------------------------------------------

    def _server_down(self, link: ServerLink) -> ToolServerDown:
        link.told = True
        return ToolServerDown(link.unavailable_message)

    def _usable(self, name: str, server: McpServerConfig) -> bool:
        """Whether the agent may call at least one of the server's tools in this task."""
        if self._allowed_tools is None:
            return any(self._grants.covers(grant) for grant in server.tools.values())
        prefix = name + SEPARATOR
        for allowed in self._allowed_tools:
            if allowed.startswith(prefix):
                grant = server.required_grant(allowed.removeprefix(prefix))
                if grant is not None and self._grants.covers(grant):
                    return True
        return False

    async def _connect_all(self, runners: anyio.abc.TaskGroup) -> None:
        for name, server in self._servers.items():
            if self._usable(name, server):
                link = ServerLink(name=name, config=server)
                self._links[name] = link
                runners.start_soon(self._run_server, link, name=f"mcp server {name}")
        with anyio.move_on_after(self._connect_timeout_s):
            for link in self._links.values():
                await link.ready.wait()
        for link in self._links.values():
            if not link.ready.is_set():
                link.withdraw(f"did not connect within {self._connect_timeout_s:g} s")
                link.scope.cancel()

    async def _close_all(self, runners: anyio.abc.TaskGroup) -> None:
        for link in self._links.values():
            link.closing.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
            for link in self._links.values():
                await link.gone.wait()
        runners.cancel_scope.cancel()

    async def _run_server(self, link: ServerLink) -> None:
        """Hold one server's connection open until the toolbox closes or the server fails."""
        with link.scope:
            try:
                if link.config.pool:
                    await self._hold_pooled(link)
                elif self._shares(link.config):
                    await self._hold_shared(link)
                else:
                    await self._hold_session(link)
            except Exception as exc:
                link.withdraw(link.failure_reason(exc, self._auth_token))
            finally:
                link.ready.set()
                link.gone.set()

    async def _hold_session(self, link: ServerLink) -> None:
        """A session of this task's own: HTTP, or a stdio server started for this task."""
        async with Client(
            self._transport(link), mode="auto", cache=None, client_info=CLIENT_INFO
        ) as client:
            await self._offer(link, client)
            await link.closing.wait()

    async def _hold_pooled(self, link: ServerLink) -> None:
        """A pooled stdio server: shared, left running when the task ends."""
        session = await stdio_pool().session(
            link.name,
            link.config,
            max_result_bytes=self._max_result_bytes,
            start_timeout_s=self._connect_timeout_s,
            on_spawn=self._on_spawn,
        )
        await self._offer(link, session)

        async def withdraw_when_closing() -> None:
            await session.wait_closing()
            link.withdraw("the server process exited")

        async with anyio.create_task_group() as watch:
            watch.start_soon(withdraw_when_closing)
            await link.closing.wait()
            watch.cancel_scope.cancel()

    def _shares(self, server: McpServerConfig) -> bool:
        """Whether this server's session is the process's: a first-party HTTP server, in a
        process with a loop for long-lived clients (not an rq job process)."""
        return self._share_sessions and server.first_party and server.is_http

    async def _hold_shared(self, link: ServerLink) -> None:
        """The process's session to a first-party HTTP server, used by this task."""
        owner = process_loop()
        assert owner is not None and link.config.url is not None
        settings = SessionSettings(
            url=link.config.url,
            headers=tuple(sorted(link.config.http_headers(self._auth_token).items())),
            max_result_bytes=self._max_result_bytes,
            connect_timeout_s=self._connect_timeout_s,
            concurrency=self._concurrency,
        )
        try:
            session = await shared_sessions(owner).session(link.name, link.config, settings)
        except SharedSessionUnavailable as exc:
            if exc.refused_status is not None:
                link.note_refusal(exc.refused_status)
            raise
        await self._offer(link, session)
        await link.closing.wait()

    async def _offer(self, link: ServerLink, client: ToolCaller) -> None:
        """List the server's tools (or take them from the cache), then mark the link ready."""
        for tool in await server_tools(link, client, ttl_s=self._tool_list_ttl_s):
            link.take(tool, may_offer=self._may_offer)
        link.client = client
        link.ready.set()

    def _transport(self, link: ServerLink) -> Transport:
        server = link.config
        if server.url is not None:
            return http_streams(
                server.url,
                server.http_headers(self._auth_token),
                connect_timeout_s=self._connect_timeout_s,
                max_result_bytes=self._max_result_bytes,
                on_refused=link.note_refusal,
            )
        return stdio_streams(
            link.name,
            server,
            max_result_bytes=self._max_result_bytes,
            on_spawn=self._on_spawn,
            on_exit=lambda: link.withdraw("the server process exited"),
        )

    def _may_offer(self, name: str, required_grant: str) -> bool:
        """Whether the model sees ``name``: the task allows it and the agent holds its grant."""
        allowed = self._allowed_tools is None or name in self._allowed_tools
        return allowed and self._grants.covers(required_grant)


def _forget_list_if_unknown(link: ServerLink, error_text: str) -> None:
    """A server that no longer knows a tool it listed: the next task asks it for its list."""
    if link.caches_tool_list and _UNKNOWN_TOOL.search(error_text):
        tool_lists.invalidate(link.config.identity(link.name))
