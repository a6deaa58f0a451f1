"""The model forwarder of a CLI's sandbox: to the model endpoint, and nowhere else.

A real TCP server on loopback plays the endpoint; the test connects to the forwarder's
Unix socket as the sandbox's relay does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from worker.executors._egress import PROXY_PORT, ModelRoute, model_forwarder

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """A loopback TCP server that sends back what it receives; yields its port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def echo(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                while True:
                    await stream.send(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return

    async with anyio.create_task_group() as servers:
        servers.start_soon(listener.serve, echo)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        servers.cancel_scope.cancel()


async def exchange(socket_path: Path, *messages: bytes) -> bytes:
    """Send ``messages`` in turn over the forwarder; what came back, until it closes or 2 s."""
    received = b""
    async with await anyio.connect_unix(socket_path) as stream:
        for message in messages:
            try:
                await stream.send(message)
                with anyio.move_on_after(2):
                    received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break  # the forwarder closed the connection
    return received


def test_routes_by_scheme() -> None:
    plain = ModelRoute.of("http://10.0.0.5:8000/v1")
    assert (plain.host, plain.port, plain.tls, plain.inside_port) == ("10.0.0.5", 8000, False, 8000)
    assert plain.inside_url("http://10.0.0.5:8000/v1") == "http://127.0.0.1:8000/v1"
    assert plain.proxy_environment() == {}
    tls = ModelRoute.of("https://api.anthropic.com")
    assert (tls.host, tls.port, tls.inside_port) == ("api.anthropic.com", 443, PROXY_PORT)
    assert tls.inside_url("https://api.anthropic.com") == "https://api.anthropic.com"
    assert tls.proxy_environment()["HTTPS_PROXY"] == f"http://127.0.0.1:{PROXY_PORT}"


async def test_connect_reaches_the_endpoint_only(tmp_path: Path) -> None:
    async with echo_server() as endpoint_port, echo_server() as other_port:
        route = ModelRoute(host="127.0.0.1", port=endpoint_port, tls=True, inside_port=PROXY_PORT)
        socket_path = tmp_path / "model.sock"
        async with model_forwarder(socket_path, route, "t-egress"):
            allowed = await exchange(
                socket_path, f"CONNECT 127.0.0.1:{endpoint_port} HTTP/1.1\r\n\r\n".encode(), b"hi"
            )
            refused = await exchange(
                socket_path, f"CONNECT 127.0.0.1:{other_port} HTTP/1.1\r\n\r\n".encode(), b"hi"
            )
            not_connect = await exchange(
                socket_path, f"GET http://127.0.0.1:{endpoint_port}/ HTTP/1.1\r\n\r\n".encode()
            )

    assert allowed == b"HTTP/1.1 200 Connection established\r\n\r\nhi"
    assert refused.startswith(b"HTTP/1.1 403 Forbidden") and b"hi" not in refused
    assert not_connect.startswith(b"HTTP/1.1 403 Forbidden")


async def test_plain_http_endpoints_are_spliced_to_their_address(tmp_path: Path) -> None:
    async with echo_server() as endpoint_port:
        route = ModelRoute.of(f"http://127.0.0.1:{endpoint_port}")
        socket_path = tmp_path / "model.sock"
        async with model_forwarder(socket_path, route, "t-egress"):
            echoed = await exchange(socket_path, b"POST /v1/messages HTTP/1.1\r\n\r\n")

    assert echoed == b"POST /v1/messages HTTP/1.1\r\n\r\n"
