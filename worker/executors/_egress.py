"""The only way out of a CLI's sandbox: a forwarder to its model endpoint, and nowhere else.

The sandbox has no network but its loopback. Its helper listens on ``127.0.0.1:<port>``
inside and relays every connection to a Unix socket the worker serves here; the worker
connects each one to the model endpoint's host and port, and to nothing else.

- ``http://host:port/...`` endpoints: the CLI is given ``http://127.0.0.1:port/...``
  and every connection is spliced to ``host:port``.
- ``https://host[:port]/...`` endpoints: the CLI keeps the URL and gets
  ``HTTPS_PROXY=http://127.0.0.1:3128``; each connection must open with
  ``CONNECT host:port``, for exactly that host and port, and TLS then runs end to end
  between the CLI and the endpoint. Any other target gets ``403`` and is closed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from worker.logs import log_event

# The proxy's port inside the sandbox (its own network namespace: nothing else listens).
PROXY_PORT = 3128
_HEAD_LIMIT = 8192
_CHUNK = 65_536
CONNECT_TIMEOUT_S = 30.0
CLOSE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRoute:
    """Where the model endpoint is, and how the CLI inside reaches it."""

    host: str
    port: int
    tls: bool
    # The port the helper listens on inside the sandbox.
    inside_port: int

    @classmethod
    def of(cls, base_url: str) -> ModelRoute:
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(
            host=parts.hostname or "", port=port, tls=tls, inside_port=PROXY_PORT if tls else port
        )

    def inside_url(self, base_url: str) -> str:
        """The endpoint URL as the CLI inside the sandbox uses it."""
        if self.tls:
            return base_url
        parts = urlsplit(base_url)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.inside_port}"))

    def proxy_environment(self) -> dict[str, str]:
        """The CLI's proxy variables: only for TLS endpoints, which go through CONNECT."""
        if not self.tls:
            return {}
        proxy = f"http://127.0.0.1:{self.inside_port}"
        return {"HTTPS_PROXY": proxy, "https_proxy": proxy, "NO_PROXY": "", "no_proxy": ""}


@asynccontextmanager
async def model_forwarder(socket_path: Path, route: ModelRoute, task: str) -> AsyncIterator[None]:
    """Serve ``socket_path`` while the CLI runs: each connection goes to ``route`` only."""
    listener = await anyio.create_unix_listener(socket_path)
    os.chmod(socket_path, 0o666)  # the sandbox user connects; its directory guards it
    open_connections = 0
    async with anyio.create_task_group() as connections:

        async def handle(client: anyio.abc.SocketStream) -> None:
            nonlocal open_connections
            open_connections += 1
            try:
                async with client:
                    await _forward(client, route, task)
            finally:
                open_connections -= 1

        async def serve() -> None:
            async with listener:
                await listener.serve(handle, task_group=connections)

        connections.start_soon(serve)
        try:
            yield
        finally:
            # The sandbox is gone: its connections end by themselves. Cancelling a read
            # just as its end arrives trips asyncio ("Future.set_result: invalid state").
            with anyio.move_on_after(CLOSE_GRACE_S, shield=True):
                while open_connections:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            connections.cancel_scope.cancel()


async def _forward(client: anyio.abc.SocketStream, route: ModelRoute, task: str) -> None:
    buffered = BufferedByteReceiveStream(client)
    if route.tls:
        try:
            head = await buffered.receive_until(b"\r\n\r\n", _HEAD_LIMIT)
        except (anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.BrokenResourceError):
            return
        target = _connect_target(head)
        if target != (route.host.lower(), route.port):
            log_event(
                "egress_refused",
                "warning",
                task=task,
                target=f"{target[0]}:{target[1]}" if target else head[:80].decode("latin-1"),
                allowed=f"{route.host}:{route.port}",
            )
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await client.send(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
    try:
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            upstream = await anyio.connect_tcp(route.host, route.port)
    except (OSError, TimeoutError):
        if route.tls:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await client.send(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        return
    async with upstream:
        if route.tls:
            await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(_pump, buffered, upstream)
            pumps.start_soon(_pump, upstream, client)


def _connect_target(head: bytes) -> tuple[str, int] | None:
    """``(host, port)`` of a ``CONNECT host:port HTTP/1.1`` request head, or None."""
    words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(words) != 3 or words[0].upper() != "CONNECT":
        return None
    host, _, port = words[1].rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]").lower(), int(port)


async def _pump(
    source: anyio.abc.ByteReceiveStream | BufferedByteReceiveStream,
    target: anyio.abc.SocketStream,
) -> None:
    try:
        while True:
            data = await source.receive(_CHUNK)
            await target.send(data)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await target.send_eof()
