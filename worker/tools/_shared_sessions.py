"""Shared MCP sessions: one per first-party HTTP server per worker process, for all its tasks.

A first-party HTTP server (``first_party: true`` with a ``url``: ``mcp-hub``, ``mcp-web``,
``mcp-memory``) gets the worker's own credentials, ``MCP_AUTH_TOKEN``, the same for every
task. So with WORKER_CONCURRENCY > 1 the process keeps one session to it, on the process
loop (``worker._process_loop``), instead of one per task: no ``server/discover`` (or
``initialize``), no new connection or TLS handshake and, while the server's list has not
changed, no ``tools/list`` per task.

::

    task thread (its own loop)             process loop (one per worker process)
    ─────────────────────────              ─────────────────────────────────────
    SharedSession.call_tool  ──run()──▶    _Session.client.call_tool(meta=the task's)
      awaits; cancelled → cancels it       ├─ listener: tools list_changed → list dropped
                                           └─ lost (restart, 404, stream dropped) → reopened

Authority is per call. Each call's ``_meta`` carries the task's agent, task, idempotency key,
deadline and signed capability, and the SDK adds the call's ``traceparent`` from the task's
context (the call runs on the process loop in a copy of it). The session itself carries only
what every task shares: the worker's token and the negotiated protocol.

Failures. A server that restarts, drops the session (HTTP 404 "Session terminated") or the
connection, ends the session: the next call opens a new one. The call that met the loss is
sent again once on the new session when it carries an idempotency key (every tool call does;
the server answers a replay with what it did the first time) and a ``tools/list`` always;
else the task sees the server go down, as with a session of its own. A task cancelled (its
deadline, stop-job) cancels its own request only: one POST per request, the session goes on.

The fork-per-job mode (WORKER_CONCURRENCY = 1) keeps a session per task: an rq job process
has no process loop (``process_loop()`` is None).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.abc
import mcp_types
from mcp.client import Client
from mcp.client.session import IncomingMessage
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from worker._process_loop import ProcessLoop, pool_limits
from worker.logs import log_event
from worker.tools._config import McpServerConfig
from worker.tools._links import CLIENT_INFO, describe_failure, every_page
from worker.tools._tool_cache import tool_lists
from worker.tools._transports import http_streams

_T = TypeVar("_T")
# How often a call that lost its session tries to open a new one.
_REOPEN_INTERVAL_S = 0.25


class SharedSessionUnavailable(RuntimeError):
    """The shared session could not be opened; ``refused_status`` when the server refused
    the worker's credentials (401, 403)."""

    def __init__(self, message: str, refused_status: int | None) -> None:
        super().__init__(message)
        self.refused_status = refused_status


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """How a session is opened: one shared session per distinct value."""

    url: str
    # The worker's token among them: never in a repr.
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    max_result_bytes: int
    connect_timeout_s: float
    concurrency: int

    def key(self, name: str, config: McpServerConfig) -> str:
        """A digest, not the headers: no secret sits in a key."""
        parts = (name, config.identity(name), repr(self), repr(self.headers))
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


@dataclass(eq=False)
class _Session:
    """One open session to one server; lives on the process loop only."""

    name: str
    config: McpServerConfig
    settings: SessionSettings
    client: Client | None = None
    failure: str | None = None
    refused_status: int | None = None
    # The server's whole tool list, kept while the server promised to say when it changes.
    tools: tuple[mcp_types.Tool, ...] | None = None
    watches_list: bool = False
    # The server answered the session's id with 404: it restarted, or the session expired.
    server_forgot: bool = False
    ready: anyio.Event = field(default_factory=anyio.Event)
    # Set once the session ends (lost, or the process stops it): never handed out again.
    stop: anyio.Event = field(default_factory=anyio.Event)
    gone: anyio.Event = field(default_factory=anyio.Event)

    @property
    def usable(self) -> bool:
        return not self.stop.is_set()

    async def run(self) -> None:
        """Open the session, watch the server's tool list, hold it until it ends."""
        settings = self.settings
        transport = http_streams(
            settings.url,
            dict(settings.headers),
            connect_timeout_s=settings.connect_timeout_s,
            max_result_bytes=settings.max_result_bytes,
            on_refused=self._note_refusal,
            limits=pool_limits(settings.concurrency),
            on_session_gone=self._note_session_gone,
        )
        # Bounds the opening only: the deadline is lifted once the session is ready.
        with anyio.CancelScope(
            deadline=anyio.current_time() + settings.connect_timeout_s
        ) as opening:
            try:
                async with (
                    Client(
                        transport,
                        mode="auto",
                        cache=None,
                        client_info=CLIENT_INFO,
                        message_handler=self._on_message,
                    ) as client,
                    anyio.create_task_group() as watchers,
                ):
                    self.client = client
                    await self._watch_list(client, watchers)
                    opening.deadline = math.inf
                    log_event(
                        "mcp_shared_session_opened",
                        server=self.name,
                        protocol=client.protocol_version,
                        watches_tool_list=self.watches_list,
                    )
                    self.ready.set()
                    await self.stop.wait()
                    watchers.cancel_scope.cancel()
            except Exception as exc:
                self.failure = describe_failure(exc)
            finally:
                if opening.cancel_called and not self.ready.is_set():
                    self.failure = f"did not connect within {settings.connect_timeout_s:g} s"
                self.lose(self.failure or "the session closed")
                self.ready.set()
                self.gone.set()

    def lose(self, reason: str) -> None:
        """End the session; the next call opens a new one and lists the tools again."""
        if self.usable and self.client is not None:  # an opening that failed is no loss
            log_event("mcp_shared_session_lost", "warning", server=self.name, reason=reason)
        self.stop.set()
        self.client = None
        self._forget_list()

    def live_client(self) -> Client:
        if self.client is None or not self.usable:
            raise MCPError(CONNECTION_CLOSED, f"the session to {self.name!r} ended")
        return self.client

    async def _watch_list(self, client: Client, watchers: anyio.abc.TaskGroup) -> None:
        """Ask to be told when the tool list changes: the list is kept only while we are."""
        tools = client.server_capabilities.tools
        if tools is None or not tools.list_changed:
            return
        try:
            await watchers.start(self._listen, client)
        except ListenNotSupportedError:
            # A 2025-era session: the notification comes through ``_on_message``.
            self.watches_list = True

    async def _listen(
        self, client: Client, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listening = False
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                honored = subscription.honored
                self.watches_list = bool(honored and honored.tools_list_changed)
                task_status.started()
                listening = True
                async for _ in subscription:
                    self._forget_list()
        except (SubscriptionLost, MCPError) as exc:
            if not listening:  # refused: the session goes on, its list kept by the TTL cache
                log_event("mcp_tool_list_unwatched", server=self.name, reason=describe_failure(exc))
                task_status.started()
                return
            # The server went away under the stream: the session is as good as gone.
            self.lose(describe_failure(exc))
            return
        if self.usable:
            self.lose("the server closed the tool-list stream")

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._forget_list()

    def _forget_list(self) -> None:
        self.tools = None
        tool_lists.invalidate(self.config.identity(self.name))

    def _note_refusal(self, status: int) -> None:
        self.refused_status = status

    def _note_session_gone(self) -> None:
        self.server_forgot = True

    async def list_all_tools(self) -> tuple[mcp_types.Tool, ...]:
        """The whole list, from the session's copy while the server would have said otherwise."""
        if self.tools is not None:
            return self.tools
        listed = await every_page(self.live_client())
        if self.watches_list and self.usable:
            self.tools = listed
        return listed


class SharedSessions:
    """The process's shared sessions, on its loop. Use ``session`` from a task's loop."""

    def __init__(self, owner: ProcessLoop) -> None:
        self._owner = owner
        # Touched on the process loop only.
        self._sessions: dict[str, _Session] = {}
        self._runners: set[asyncio.Task[None]] = set()

    async def session(
        self, name: str, config: McpServerConfig, settings: SessionSettings
    ) -> SharedSession:
        """A task's handle on the shared session to ``name``, opened if need be."""
        key = settings.key(name, config)
        await self._owner.run(self._ready(key, name, config, settings))
        return SharedSession(self, key, name, config, settings)

    async def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Await ``work`` on the process loop, in a copy of the caller's context."""
        return await self._owner.run(work, context=contextvars.copy_context())

    async def _ready(
        self, key: str, name: str, config: McpServerConfig, settings: SessionSettings
    ) -> _Session:
        session = self._sessions.get(key)
        if session is None or not session.usable:
            session = _Session(name=name, config=config, settings=settings)
            self._sessions[key] = session
            runner = asyncio.get_running_loop().create_task(session.run())
            # The loop keeps only a weak reference to a task.
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        await session.ready.wait()
        if session.client is None:
            raise SharedSessionUnavailable(
                session.failure or "the session closed", session.refused_status
            )
        return session

    async def call(
        self,
        key: str,
        opening: tuple[str, McpServerConfig, SessionSettings],
        work: Callable[[_Session], Awaitable[_T]],
        *,
        replayable: bool,
    ) -> _T:
        """Run ``work`` on the live session; if the session was lost under it, open a new one
        and, when ``replayable``, run it there once more. A session lost between calls (the
        server restarted) is opened again as for a retry."""
        session = await self._reopen(key, *opening)
        try:
            return await work(session)
        except Exception as exc:
            if not (session.server_forgot or _session_lost(exc)):
                raise
            session.lose(describe_failure(exc))
            if not replayable:
                raise MCPError(CONNECTION_CLOSED, describe_failure(exc)) from exc
        session = await self._reopen(key, *opening)
        log_event("mcp_shared_session_retry", server=session.name)
        return await work(session)

    async def _reopen(
        self, key: str, name: str, config: McpServerConfig, settings: SessionSettings
    ) -> _Session:
        """A new session for a call that met the loss of the last one: a server restarting
        refuses connections for a moment, so it is tried until the connect timeout."""
        failure = f"no new session within {settings.connect_timeout_s:g} s"
        with anyio.move_on_after(settings.connect_timeout_s):
            while True:
                try:
                    return await self._ready(key, name, config, settings)
                except SharedSessionUnavailable as exc:
                    if exc.refused_status is not None:
                        raise MCPError(CONNECTION_CLOSED, str(exc)) from exc
                    failure = str(exc)
                await anyio.sleep(_REOPEN_INTERVAL_S)
        raise MCPError(CONNECTION_CLOSED, failure)


def _session_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the session (not the call) failed: its connection closed (a
    404 to the session's id is heard by the transport: ``_Session.server_forgot``)."""
    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return isinstance(exc, OSError)


class SharedSession:
    """One task's use of a shared session: the ``call_tool``/``list_tools`` of an MCP
    ``Client``, each run on the process loop with the task's own ``_meta``."""

    def __init__(
        self,
        sessions: SharedSessions,
        key: str,
        name: str,
        config: McpServerConfig,
        settings: SessionSettings,
    ) -> None:
        self._sessions = sessions
        self._key = key
        self._opening = (name, config, settings)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        meta: mcp_types.RequestParamsMeta | None = None,
    ) -> mcp_types.CallToolResult:
        async def call(session: _Session) -> mcp_types.CallToolResult:
            return await session.live_client().call_tool(name, arguments, meta=meta)

        keyed = bool(meta and meta.get("idempotency_key"))
        return await self._sessions.run(
            self._sessions.call(self._key, self._opening, call, replayable=keyed)
        )

    async def list_tools(self, *, cursor: str | None = None) -> mcp_types.ListToolsResult:
        """The whole list in one page (``cursor`` is never needed): the session's copy when
        it has one."""

        async def listing(session: _Session) -> tuple[mcp_types.Tool, ...]:
            return await session.list_all_tools()

        tools = await self._sessions.run(
            self._sessions.call(self._key, self._opening, listing, replayable=True)
        )
        return mcp_types.ListToolsResult(tools=list(tools))


_shared: SharedSessions | None = None


def shared_sessions(owner: ProcessLoop) -> SharedSessions:
    """The shared sessions on ``owner``, this process's loop."""
    global _shared
    if _shared is None:
        _shared = SharedSessions(owner)
    return _shared


def _forget_in_child() -> None:
    # The parent's sessions live on its loop, which the child does not have.
    global _shared
    _shared = None


os.register_at_fork(after_in_child=_forget_in_child)
