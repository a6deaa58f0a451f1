"""The Toolbox of MCP tools for one task: offer, resolve, call, withdraw dead servers.

``McpToolbox.open`` connects, concurrently, to the configured servers that hold
at least one tool the agent may use, lists their tools once, and offers each as
``<server>__<tool>``. What ``resolve`` answers for a name:

- None: unknown server, tool not in the config's map (or not listed by its
  server), tool left out by the task's ``allowed_tools`` or the agent's
  ``servers``, a server that never started, or a dead server's tool once the
  model has been told the server is gone.
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
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.abc
import httpx2
import mcp_types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp.client import Client, Transport
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)

from worker._tls import client_ssl_context
from worker.exceptions import ToolFailed, ToolNotFound, ToolServerDown
from worker.logs import log_event
from worker.models._types import ToolSpec
from worker.tools._base import CallContext, Granted, MissingGrant, Resolution, ToolResult
from worker.tools._config import McpConfig, McpServerConfig
from worker.tools._grants import EffectiveGrants

SEPARATOR = "__"
# What the providers accept as a tool name (OpenAI's rule is the strictest).
_MODEL_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CLIENT_INFO = mcp_types.Implementation(name="hub-agent-worker", version="0.1.0")
# How long closing may take before the servers still open are cancelled (stdio
# children are then killed by their transport, whatever happens).
CLOSE_TIMEOUT_S = 5.0
_MAX_LIST_PAGES = 100
# One JSON-RPC line from a stdio server; a longer line means the framing is broken.
_MAX_STDIO_LINE_BYTES = 64 * 1024 * 1024
# Stdio shutdown, as the MCP spec orders it: close stdin, wait, then signal the group.
_STDIO_EXIT_GRACE_S = 2.0
_STDIO_KILL_GRACE_S = 2.0


@dataclass(eq=False)
class _ServerLink:
    """One server's connection for this task, owned by its runner task."""

    name: str
    config: McpServerConfig
    # Mapped tools the server listed, by the server's own tool name.
    listed: dict[str, ToolSpec] = field(default_factory=dict)
    offered: list[ToolSpec] = field(default_factory=list)
    client: Client | None = None
    down_reason: str | None = None
    # Whether a call already told the model that this server is gone.
    told: bool = False
    ready: anyio.Event = field(default_factory=anyio.Event)
    closing: anyio.Event = field(default_factory=anyio.Event)
    gone: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    @property
    def unavailable_message(self) -> str:
        return f"server {self.name!r} is unavailable; its tools were withdrawn for this task"

    def withdraw(self, reason: str) -> None:
        if self.down_reason is None:
            self.down_reason = reason
            log_event("mcp_server_withdrawn", "warning", server=self.name, reason=reason)
        self.closing.set()


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
        connect_timeout_s: float,
        on_spawn: Callable[[int], None] | None,
    ) -> None:
        self._grants = grants
        self._allowed_tools = None if allowed_tools is None else frozenset(allowed_tools)
        self._auth_token = auth_token
        self._connect_timeout_s = connect_timeout_s
        self._on_spawn = on_spawn
        # The servers this agent may use at all: the config, narrowed by the agent's list.
        self._servers = {
            name: server
            for name, server in config.servers.items()
            if not servers or name in servers
        }
        if unknown := sorted(set(servers or ()) - set(config.servers)):
            log_event("mcp_servers_unknown", "warning", servers=sorted(unknown))
        self._links: dict[str, _ServerLink] = {}

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
        connect_timeout_s: float = 10.0,
        on_spawn: Callable[[int], None] | None = None,
    ) -> AsyncIterator[McpToolbox]:
        """Connect for one task; every session and child process is closed on exit.

        ``allowed_tools`` (model-visible names; None: no narrowing) is the task's narrowing,
        ``servers`` the agent's ``mcp_servers`` (None or empty: all). ``auth_token`` goes as
        ``Authorization: Bearer`` to HTTP servers whose ``headers`` set none.
        ``on_spawn`` gets the pid (= process group) of every stdio server started.
        """
        toolbox = cls(
            config,
            grants=grants,
            allowed_tools=allowed_tools,
            servers=servers,
            auth_token=auth_token,
            connect_timeout_s=connect_timeout_s,
            on_spawn=on_spawn,
        )
        raised_in_block: BaseException | None = None
        try:
            async with anyio.create_task_group() as runners:
                try:
                    await toolbox._connect_all(runners)
                    yield toolbox
                finally:
                    await toolbox._close_all(runners)
        except BaseExceptionGroup as group:
            # Runners never raise, so the group only wraps what the caller's block raised:
            # hand that back as it was, not wrapped.
            if len(group.exceptions) != 1:
                raise
            raised_in_block = group.exceptions[0]
        if raised_in_block is not None:
            raise raised_in_block

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
        if self._allowed_tools is not None and name not in self._allowed_tools:
            return None
        link = self._links.get(server_name)
        # A server we did not connect to cannot tell us whether the tool exists: trust the map.
        exists = None if link is None or link.client is None else tool in link.listed
        if not self._grants.covers(required_grant):
            return (
                None if exists is False else MissingGrant(name=name, required_grant=required_grant)
            )
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
        meta = cast(mcp_types.RequestParamsMeta, ctx.meta())
        try:
            with anyio.fail_after(ctx.timeout_s):
                result = await client.call_tool(tool, arguments, meta=meta)
        except TimeoutError as exc:
            raise ToolFailed(f"tool {name} timed out after {ctx.timeout_s:.1f} s") from exc
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                link.withdraw("the connection closed")
                raise self._server_down(link) from exc
            if exc.code == REQUEST_TIMEOUT:
                raise ToolFailed(f"tool {name} timed out after {ctx.timeout_s:.1f} s") from exc
            raise ToolFailed(f"tool {name} failed: {exc.message}") from exc
        except Exception as exc:
            # The runner may have lost the connection while this call was starting.
            if link.down_reason is not None:
                raise self._server_down(link) from exc
            raise ToolFailed(f"tool {name} failed: {type(exc).__name__}: {exc}") from exc
        return ToolResult(content=result_text(result), is_error=result.is_error)

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

    def _server_down(self, link: _ServerLink) -> ToolServerDown:
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
                link = _ServerLink(name=name, config=server)
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

    async def _run_server(self, link: _ServerLink) -> None:
        """Hold one server's connection open until the toolbox closes or the server fails."""
        with link.scope:
            try:
                client = Client(
                    self._transport(link), mode="auto", cache=None, client_info=_CLIENT_INFO
                )
                async with client:
                    await self._list_tools(link, client)
                    link.client = client
                    link.ready.set()
                    await link.closing.wait()
            except Exception as exc:
                link.withdraw(_describe_failure(exc))
            finally:
                link.ready.set()
                link.gone.set()

    def _transport(self, link: _ServerLink) -> Transport:
        server = link.config
        if server.url is not None:
            headers = {key: value.get_secret_value() for key, value in server.headers.items()}
            if self._auth_token and not any(key.lower() == "authorization" for key in headers):
                headers["Authorization"] = f"Bearer {self._auth_token}"
            return _http_streams(server.url, headers, connect_timeout_s=self._connect_timeout_s)
        return _stdio_streams(
            server,
            on_spawn=self._on_spawn,
            on_exit=lambda: link.withdraw("the server process exited"),
        )

    async def _list_tools(self, link: _ServerLink, client: Client) -> None:
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                self._add_tool(link, tool)
            cursor = page.next_cursor
            if cursor is None:
                return

    def _add_tool(self, link: _ServerLink, tool: mcp_types.Tool) -> None:
        required_grant = link.config.required_grant(tool.name)
        if required_grant is None:
            return
        name = f"{link.name}{SEPARATOR}{tool.name}"
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
            input_schema=dict(tool.input_schema),
        )
        link.listed[tool.name] = spec
        allowed = self._allowed_tools is None or name in self._allowed_tools
        if allowed and self._grants.covers(required_grant):
            link.offered.append(spec)


def result_text(result: CallToolResult) -> str:
    """What the model reads of a tool result: text as is, binary content as short placeholders."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, TextContent):
            has_text = True
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            parts.append(f"[image: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif isinstance(block, AudioContent):
            parts.append(f"[audio: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            if isinstance(resource, BlobResourceContents):
                mime_type = resource.mime_type or "application/octet-stream"
                size = _decoded_size(resource.blob)
                parts.append(f"[resource: {resource.uri}, {mime_type}, {size} bytes]")
            else:
                has_text = True
                parts.append(f"[resource: {resource.uri}]\n{resource.text}")
    if not has_text and result.structured_content is not None:
        structured = json.dumps(
            result.structured_content, separators=(",", ":"), ensure_ascii=False, default=str
        )
        parts.insert(0, structured)
    return "\n".join(parts)


def _decoded_size(base64_text: str) -> int:
    padding = len(base64_text) - len(base64_text.rstrip("="))
    return len(base64_text) * 3 // 4 - padding


def _describe_failure(exc: BaseException) -> str:
    """The innermost first cause, as ``Class: message``, for logs and ``unavailable_servers``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# -- transports -------------------------------------------------------------------------------

_Streams = tuple[Any, Any]


@asynccontextmanager
async def _http_streams(
    url: str, headers: dict[str, str], *, connect_timeout_s: float
) -> AsyncIterator[_Streams]:
    # Read timeout stays long: a server may hold a response stream open, and each
    # call is bounded by its own remaining budget anyway.
    timeout = httpx2.Timeout(connect_timeout_s, read=300.0)
    async with (
        httpx2.AsyncClient(
            headers=headers, timeout=timeout, verify=client_ssl_context()
        ) as http_client,
        streamable_http_client(url, http_client=http_client) as streams,
    ):
        yield streams


@asynccontextmanager
async def _stdio_streams(
    server: McpServerConfig,
    *,
    on_spawn: Callable[[int], None] | None,
    on_exit: Callable[[], None],
) -> AsyncIterator[_Streams]:
    """Run a stdio server in its own session and bridge its pipes to the MCP session.

    Written here rather than using the SDK's ``stdio_client`` because the worker
    needs the pid (trap 8: a hard-killed job's servers must be found and killed).
    """
    assert server.command is not None
    env = get_default_environment() | {
        key: value.get_secret_value() for key, value in server.env.items()
    }
    # stderr is inherited: the server's diagnostics go where the worker's go.
    process = await anyio.open_process(
        [server.command, *server.args],
        env=env,
        cwd=server.cwd,
        stderr=None,
        start_new_session=True,
    )
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False

    async def read_stdout() -> None:
        assert process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)
        async with to_session:
            while True:
                try:
                    line = await lines.receive_until(b"\n", _MAX_STDIO_LINE_BYTES)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                except anyio.DelimiterNotFound:
                    log_event("mcp_line_too_long", "warning", command=server.command)
                    break
                if not line.strip():
                    continue
                try:
                    item: SessionMessage | Exception = SessionMessage(
                        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    )
                except ValueError as exc:
                    item = exc
                try:
                    await to_session.send(item)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
        if not shutting_down:
            on_exit()

    async def write_stdin() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # The server stopped reading: end the session instead of hanging its requests.
            await to_session.aclose()

    try:
        if on_spawn is not None:
            on_spawn(process.pid)
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(read_stdout)
            pumps.start_soon(write_stdin)
            try:
                yield from_server, to_server
            finally:
                shutting_down = True
                pumps.cancel_scope.cancel()
    finally:
        # Shielded and bounded: a cancelled caller must not leave the server running.
        with anyio.CancelScope(shield=True):
            for stream in (from_server, to_server, to_session, from_session):
                stream.close()
            await _stop_process(process)


async def _stop_process(process: anyio.abc.Process) -> None:
    """Close stdin, give the server a moment to exit, then terminate its whole process group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    # Polling, not process.wait(): on asyncio that also waits for the pipes to reach EOF.
    with anyio.move_on_after(_STDIO_EXIT_GRACE_S):
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    # Also when the leader exited: helpers it left in its group go with it.
    await terminate_posix_process_tree(process, _STDIO_KILL_GRACE_S)
    with anyio.move_on_after(_STDIO_KILL_GRACE_S):
        await process.aclose()
