"""The only way out of a CLI's sandbox: the model relay, which also holds the provider key.

The sandbox has no network but its loopback. Its helper listens on ``127.0.0.1:3128``
inside and relays every connection to a Unix socket the worker serves here. The worker
reads each HTTP request on it, and sends it on to the model endpoint, and nowhere else::

    CLI ──http──▶ 127.0.0.1:3128 ─(helper)─▶ model.sock ──▶ relay (worker) ──http(s)──▶ endpoint
    key: a placeholder                                      drops the CLI's key headers,
                                                            adds the real one

- The CLI's base URL is ``http://127.0.0.1:3128`` plus the endpoint's path, whatever
  the endpoint's scheme: TLS runs from the worker to the endpoint.
- The CLI holds ``PLACEHOLDER_KEY``, a public string no provider accepts. The relay
  removes every credential header the CLI sent (``x-api-key``, ``authorization``,
  ``api-key``) and adds the agent's own: ``x-api-key`` for Anthropic, ``Authorization:
  Bearer`` for OpenAI-compatible endpoints. The real key never enters the sandbox.
- Only paths under the endpoint's own path go out; anything else (another host in an
  absolute URL, ``CONNECT``, a path outside the API) gets ``403`` and an
  ``egress_refused`` warning.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import h11
import httpx2

from worker.executors._provider import ProviderAccess
from worker.logs import log_event

# The relay's port inside the sandbox (its own network namespace: nothing else listens).
RELAY_PORT = 3128
# What the CLI holds instead of the key: public, so it opens nothing anywhere.
PLACEHOLDER_KEY = "sk-sandbox-placeholder-the-worker-relay-adds-the-key"
# Headers a CLI may carry a key in; each is dropped before the relay adds the real one.
CREDENTIAL_HEADERS = frozenset({b"x-api-key", b"authorization", b"api-key", b"proxy-authorization"})
# Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the relay sets itself.
_NOT_FORWARDED = frozenset(
    {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"trailer"}
)
_NOT_RETURNED = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length"})
MAX_REQUEST_BYTES = 32 * 1024 * 1024
_CHUNK = 65_536
CONNECT_TIMEOUT_S = 30.0
# Between two chunks of a streamed answer (a model may think for a while).
READ_TIMEOUT_S = 600.0
CLOSE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRoute:
    """Where the model endpoint is, and the credential header the relay adds to each call."""

    # The endpoint as the worker reaches it, without a trailing slash.
    base_url: str
    credential: tuple[str, str] = field(repr=False)
    inside_port: int = RELAY_PORT

    @classmethod
    def of(cls, access: ProviderAccess) -> ModelRoute:
        if access.provider == "anthropic":
            credential = ("x-api-key", access.api_key)
        else:
            credential = ("authorization", f"Bearer {access.api_key}")
        return cls(base_url=access.endpoint.rstrip("/"), credential=credential)

    @property
    def inside_url(self) -> str:
        """The endpoint URL as the CLI inside the sandbox uses it: plain HTTP to the relay."""
        parts = urlsplit(self.base_url)
        return urlunsplit(("http", f"127.0.0.1:{self.inside_port}", parts.path, "", ""))

    @property
    def base_path(self) -> str:
        return urlsplit(self.base_url).path.rstrip("/")

    def allows(self, target: bytes) -> bool:
        """True for an origin-form target under the endpoint's path (``/v1/messages?...``)."""
        path = target.decode("latin-1").split("?", 1)[0]
        if not path.startswith("/") or "/../" in path + "/" or "//" in path:
            return False
        return path == self.base_path or path.startswith(self.base_path + "/")

    def upstream_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The CLI's headers without its credentials and hop-by-hop headers, plus the key."""
        kept = [
            (name, value)
            for name, value in headers
            if name.lower() not in CREDENTIAL_HEADERS and name.lower() not in _NOT_FORWARDED
        ]
        name, value = self.credential
        return [*kept, (name.encode("latin-1"), value.encode("latin-1"))]


@asynccontextmanager
async def model_forwarder(socket_path: Path, route: ModelRoute, task: str) -> AsyncIterator[None]:
    """Serve ``socket_path`` while the CLI runs: each request goes to ``route``, key added."""
    listener = await anyio.create_unix_listener(socket_path)
    os.chmod(socket_path, 0o666)  # the sandbox user connects; its directory guards it
    open_connections = 0
    timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
    async with (
        httpx2.AsyncClient(timeout=timeout, follow_redirects=False) as http,
        anyio.create_task_group() as connections,
    ):

        async def handle(client: anyio.abc.SocketStream) -> None:
            nonlocal open_connections
            open_connections += 1
            try:
                async with client:
                    await _relay(client, route, http, task)
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


async def _relay(
    client: anyio.abc.SocketStream, route: ModelRoute, http: httpx2.AsyncClient, task: str
) -> None:
    """Each HTTP/1.1 request on one connection from the sandbox, in turn."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=_CHUNK)
    while True:
        try:
            received = await _read_request(client, connection)
        except (h11.RemoteProtocolError, anyio.BrokenResourceError, anyio.EndOfStream):
            return
        if received is None:
            return
        request, body = received
        if not route.allows(request.target):
            log_event(
                "egress_refused",
                "warning",
                task=task,
                target=f"{request.method.decode('latin-1')} "
                f"{request.target[:120].decode('latin-1')}",
                allowed=route.base_url,
            )
            await _answer(client, connection, 403, b"the sandbox reaches only its model endpoint")
            return
        try:
            await _forward(client, connection, route, http, request, body)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the CLI went away mid-answer
        except httpx2.HTTPError as exc:
            if connection.our_state is not h11.SEND_RESPONSE:
                return  # the answer had begun: only closing tells the CLI
            log_event("egress_failed", "warning", task=task, error=type(exc).__name__)
            await _answer(client, connection, 502, b"the model endpoint could not be reached")
            return
        if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
            return
        connection.start_next_cycle()


async def _read_request(
    client: anyio.abc.SocketStream, connection: h11.Connection
) -> tuple[h11.Request, bytes] | None:
    """The next request and its whole body; None when the CLI closed the connection."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await client.receive(_CHUNK)
            except anyio.EndOfStream:
                data = b""
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_REQUEST_BYTES:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _forward(
    client: anyio.abc.SocketStream,
    connection: h11.Connection,
    route: ModelRoute,
    http: httpx2.AsyncClient,
    request: h11.Request,
    body: bytes,
) -> None:
    upstream = http.build_request(
        request.method.decode("latin-1"),
        route.base_url.removesuffix(route.base_path) + request.target.decode("latin-1"),
        headers=route.upstream_headers(list(request.headers)),
        content=body,
    )
    response = await http.send(upstream, stream=True)
    try:
        headers = [
            (name, value)
            for name, value in response.headers.raw
            if name.lower() not in _NOT_RETURNED
        ]
        await client.send(
            connection.send(h11.Response(status_code=response.status_code, headers=headers)) or b""
        )
        # As each piece arrives (a size would hold back a server-sent event until it filled).
        async for chunk in response.aiter_raw():
            await client.send(connection.send(h11.Data(data=chunk)) or b"")
        await client.send(connection.send(h11.EndOfMessage()) or b"")
    finally:
        await response.aclose()


async def _answer(
    client: anyio.abc.SocketStream, connection: h11.Connection, status: int, text: bytes
) -> None:
    """A short answer of the relay's own, then the connection closes."""
    headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, h11.LocalProtocolError):
        await client.send(
            (connection.send(h11.Response(status_code=status, headers=headers)) or b"")
            + (connection.send(h11.Data(data=text)) or b"")
            + (connection.send(h11.EndOfMessage()) or b"")
        )
