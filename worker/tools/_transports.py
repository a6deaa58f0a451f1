"""How the worker talks to one MCP server: streamable HTTP or a stdio child process.

Both transports bound what a server can make the worker hold: an HTTP response
to a request is read up to ``max_result_bytes`` and then abandoned, a stdio line
(one JSON-RPC message) likewise; the request it answered fails with
``result_too_large_message``. A stdio server's stderr becomes one
``mcp_server_stderr`` log event per line (cut, rate-limited, redacted).
"""

from __future__ import annotations

import contextvars
import re
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from worker._network import client_ssl_context
from worker._spawn import SpawnHook
from worker.logs import log_event
from worker.tools._config import McpServerConfig

# httpx's own default pool, for a session of one task's.
_DEFAULT_LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20)
# Room for the JSON-RPC envelope around a result of the allowed size.
_ENVELOPE_BYTES = 64 * 1024
# Stdio shutdown, as the MCP spec orders it: close stdin, wait, then signal the group.
_STDIO_EXIT_GRACE_S = 2.0
_STDIO_KILL_GRACE_S = 2.0
# stderr: each line is cut to this many characters; a burst of lines, then a steady rate.
STDERR_LINE_MAX_CHARS = 2_000
STDERR_BURST_LINES = 100
STDERR_LINES_PER_S = 10.0
# Where a JSON-RPC message says which request it answers (servers write it first).
_MESSAGE_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")')

_Streams = tuple[Any, Any]


def result_too_large_message(max_bytes: int) -> str:
    return f"result larger than {max_bytes} bytes (MCP_RESULT_MAX_BYTES); it was not read"


@dataclass(slots=True)
class OversizeNote:
    """Set by the HTTP transport when it abandoned a response to the call that owns it."""

    max_bytes: int = 0
    oversized: bool = False


# The call in flight: the SDK runs each request's POST in a task that copies the
# caller's context, so the transport finds the note of the call it serves.
current_call_note: contextvars.ContextVar[OversizeNote | None] = contextvars.ContextVar(
    "current_call_note", default=None
)


class ResultTooLarge(httpx2.StreamError):
    """An HTTP response grew past the cap; the SDK reports it on the request it answered."""


# -- HTTP ---------------------------------------------------------------------------------------


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in self._inner:
            received += len(chunk)
            if received > self._max_bytes:
                _note_oversize(self._max_bytes)
                raise ResultTooLarge(result_too_large_message(self._max_bytes))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _note_oversize(max_bytes: int) -> None:
    note = current_call_note.get()
    if note is not None:
        note.oversized = True
        note.max_bytes = max_bytes


class CappedTransport(httpx2.AsyncBaseTransport):
    """Reads at most ``max_bytes`` of each POST response (a request's answer) while streaming."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST":
            stream = response.stream
            assert isinstance(stream, httpx2.AsyncByteStream)
            response.stream = _CappedStream(stream, self._max_bytes)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


# Called with the HTTP status when a server refuses the request's credentials.
OnRefused = Callable[[int], None]


def _no_refusal_hook(status: int) -> None:
    """Nobody asked to hear about a refusal."""


def _nobody_told() -> None:
    """Nobody asked to hear about it."""


@asynccontextmanager
async def http_streams(
    url: str,
    headers: dict[str, str],
    *,
    connect_timeout_s: float,
    max_result_bytes: int,
    on_refused: OnRefused = _no_refusal_hook,
    limits: httpx2.Limits | None = None,
    on_session_gone: Callable[[], None] = _nobody_told,
) -> AsyncIterator[_Streams]:
    """The streams of an MCP session over streamable HTTP. ``on_refused`` gets the status of
    a 401 or 403 answer: the SDK reports it only as "Server returned an error response",
    and an operator must tell a refused token from a server fault. ``limits`` bound its
    connection pool (a session shared by a process's tasks: sized from the concurrency).
    ``on_session_gone`` hears of a 404 to a request naming a session id: the server no
    longer knows the session (it restarted, or the session expired)."""
    # Read timeout stays long: a server may hold a response stream open, and each
    # call is bounded by its own remaining budget anyway.
    timeout = httpx2.Timeout(connect_timeout_s, read=300.0)
    transport = CappedTransport(
        httpx2.AsyncHTTPTransport(verify=client_ssl_context(), limits=limits or _DEFAULT_LIMITS),
        max_result_bytes,
    )

    async def note_refusal(response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            on_refused(response.status_code)
        elif response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
            on_session_gone()

    async with (
        httpx2.AsyncClient(
            headers=headers,
            timeout=timeout,
            transport=transport,
            event_hooks={"response": [note_refusal]},
        ) as http_client,
        streamable_http_client(
            url,
            http_client=http_client,
            # Above the response cap, so an oversized answer meets the cap (and its clear
            # message) first; it still bounds events on the server's GET stream.
            max_sse_event_size=max_result_bytes + _ENVELOPE_BYTES,
        ) as streams,
    ):
        yield streams


# -- stdio --------------------------------------------------------------------------------------


class _BoundedLines:
    """Newline-framed messages from a byte stream, each at most ``max_bytes``.

    A longer message is skipped to its newline; ``receive`` then answers
    ``(None, head)`` with its first bytes, so the caller can fail the request it answered.
    """

    def __init__(self, stream: anyio.abc.ByteReceiveStream, max_bytes: int) -> None:
        self._stream = stream
        self._max_bytes = max_bytes
        self._buffer = bytearray()

    async def receive(self) -> tuple[bytes | None, bytes]:
        """``(line, b"")`` or ``(None, head)`` for an oversized line; EndOfStream at the end."""
        while (newline := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > self._max_bytes:
                return None, await self._skip_line()
            self._buffer += await self._stream.receive()
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        if len(line) > self._max_bytes:
            return None, line[:1024]
        return line, b""

    async def _skip_line(self) -> bytes:
        head = bytes(self._buffer[:1024])
        self._buffer.clear()
        while (newline := self._buffer.find(b"\n")) < 0:
            self._buffer[:] = await self._stream.receive()
        del self._buffer[: newline + 1]
        return head


def _oversize_reply(head: bytes, max_bytes: int) -> SessionMessage | None:
    """An error answer to the request an oversized message answered, if its id can be read."""
    match = _MESSAGE_ID.search(head)
    if match is None:
        return None
    raw_id = match.group(1).decode()
    request_id: int | str = raw_id.strip('"') if raw_id.startswith('"') else int(raw_id)
    message = result_too_large_message(max_bytes)
    error = mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=message)
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


class StderrLog:
    """A stdio server's stderr as ``mcp_server_stderr`` events: cut, rate-limited, redacted.

    The pipe is always drained (a full pipe would block the server); lines over the
    rate are counted and the count rides on the next line logged.
    """

    def __init__(self, server: str, secrets: Mapping[str, str]) -> None:
        self._server = server
        # The server's own credentials are not in the worker's redactor: scrub them here.
        self._secrets = sorted({v for v in secrets.values() if len(v) >= 6}, key=len, reverse=True)
        self._tokens = float(STDERR_BURST_LINES)
        self._refilled_at = time.monotonic()
        self.dropped = 0

    async def pump(self, stream: anyio.abc.ByteReceiveStream) -> None:
        lines = _BoundedLines(stream, STDERR_LINE_MAX_CHARS * 4)
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            while True:
                line, head = await lines.receive()
                self.line((line if line is not None else head).decode(errors="replace"))

    def line(self, text: str) -> None:
        text = text.rstrip()
        if not text:
            return
        if not self._take_token():
            self.dropped += 1
            return
        for secret in self._secrets:  # before the cut, which could halve one
            text = text.replace(secret, "[redacted]")
        if len(text) > STDERR_LINE_MAX_CHARS:
            text = text[:STDERR_LINE_MAX_CHARS] + " [cut]"
        if self.dropped:
            dropped, self.dropped = self.dropped, 0
            log_event("mcp_server_stderr_dropped", "warning", server=self._server, lines=dropped)
        log_event("mcp_server_stderr", "info", server=self._server, line=text)

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(
            float(STDERR_BURST_LINES),
            self._tokens + (now - self._refilled_at) * STDERR_LINES_PER_S,
        )
        self._refilled_at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@asynccontextmanager
async def stdio_streams(
    name: str,
    server: McpServerConfig,
    *,
    max_result_bytes: int,
    on_spawn: SpawnHook,
    on_exit: Callable[[], None],
) -> AsyncIterator[_Streams]:
    """Run a stdio server in its own session and bridge its pipes to the MCP session.

    Written here rather than using the SDK's ``stdio_client`` because the worker
    needs the pid (a hard-killed job's servers must be found and killed), bounded
    messages, and stderr as log events. ``on_exit`` is told when the server exits by
    itself (not when this block ends).
    """
    assert server.command is not None
    server_env = {key: value.get_secret_value() for key, value in server.env.items()}
    process = await anyio.open_process(
        [server.command, *server.args],
        env=get_default_environment() | server_env,
        cwd=server.cwd,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    bridge = _StdioBridge(name, process, max_line_bytes=max_result_bytes + _ENVELOPE_BYTES)
    try:
        on_spawn(process.pid)
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(bridge.read_stdout, max_result_bytes, on_exit)
            pumps.start_soon(bridge.write_stdin)
            assert process.stderr is not None
            pumps.start_soon(StderrLog(name, server_env).pump, process.stderr)
            try:
                yield bridge.from_server, bridge.to_server
            finally:
                bridge.shutting_down = True
                pumps.cancel_scope.cancel()
    finally:
        # Shielded and bounded: a cancelled caller must not leave the server running.
        with anyio.CancelScope(shield=True):
            bridge.close_streams()
            await _stop_process(process)


class _StdioBridge:
    """A stdio server's stdout and stdin, pumped to and from the MCP session's streams."""

    def __init__(self, name: str, process: anyio.abc.Process, *, max_line_bytes: int) -> None:
        self._name = name
        self._process = process
        self._max_line_bytes = max_line_bytes
        self.to_session, self.from_server = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](0)
        self.to_server, self.from_session = anyio.create_memory_object_stream[SessionMessage](0)
        # Set when the session ends: the server's exit is then expected, not news.
        self.shutting_down = False

    async def read_stdout(self, max_result_bytes: int, on_exit: Callable[[], None]) -> None:
        """Server messages to the session, one per line; tell ``on_exit`` if the server quits."""
        assert self._process.stdout is not None
        lines = _BoundedLines(self._process.stdout, self._max_line_bytes)
        async with self.to_session:
            while True:
                try:
                    line, head = await lines.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
                item = _session_item(self._name, line, head, max_result_bytes)
                if item is None:
                    continue
                try:
                    await self.to_session.send(item)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
        if not self.shutting_down:
            on_exit()

    async def write_stdin(self) -> None:
        """Session messages to the server, one JSON line each."""
        assert self._process.stdin is not None
        try:
            async with self.from_session:
                async for message in self.from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await self._process.stdin.send(data.encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # The server stopped reading: end the session instead of hanging its requests.
            await self.to_session.aclose()

    def close_streams(self) -> None:
        for stream in (self.from_server, self.to_server, self.to_session, self.from_session):
            stream.close()


def _session_item(
    name: str, line: bytes | None, head: bytes, max_result_bytes: int
) -> SessionMessage | Exception | None:
    """What one stdout line means for the session; None to skip it."""
    if line is None:
        reply = _oversize_reply(head, max_result_bytes)
        log_event("mcp_message_too_large", "warning", server=name, max_bytes=max_result_bytes)
        if reply is None:
            return ValueError(result_too_large_message(max_result_bytes))
        return reply
    if not line.strip():
        return None
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


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
