"""The model relay of a CLI's sandbox: to the model endpoint only, the provider key added.

A real loopback HTTP server plays the endpoint and answers what it received; the test
speaks HTTP/1.1 to the relay's Unix socket as the CLI does through the sandbox's helper.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import h11
import pytest

from worker.executors._egress import PLACEHOLDER_KEY, RELAY_PORT, ModelRoute, model_forwarder
from worker.executors._provider import ProviderAccess

pytestmark = pytest.mark.anyio

REAL_KEY = "sk-real-provider-key-0123456789abcdef"


@asynccontextmanager
async def endpoint(
    release: anyio.Event | None = None,
) -> AsyncIterator[tuple[int, list[dict[str, Any]]]]:
    """A loopback HTTP endpoint answering, in three chunks, the request it received; with
    ``release``, it sends the rest only once that is set (a stream of events)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    received: list[dict[str, Any]] = []

    async def serve(stream: anyio.abc.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                request, body = None, b""
                while True:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        try:
                            connection.receive_data(await stream.receive())
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            return
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                        break
                if request is None:
                    return
                seen = {
                    "target": request.target.decode(),
                    "headers": [(n.decode(), v.decode()) for n, v in request.headers],
                    "body": body.decode(),
                }
                received.append(seen)
                answer = json.dumps(seen).encode()
                await stream.send(connection.send(h11.Response(status_code=200, headers=[])))
                for start in range(0, len(answer), len(answer) // 3 + 1):
                    chunk = answer[start : start + len(answer) // 3 + 1]
                    await stream.send(connection.send(h11.Data(data=chunk)))
                    if release is not None:
                        await release.wait()
                await stream.send(connection.send(h11.EndOfMessage()))
                connection.start_next_cycle()

    async with anyio.create_task_group() as servers:
        servers.start_soon(listener.serve, serve)
        yield listener.extra(anyio.abc.SocketAttribute.local_port), received
        servers.cancel_scope.cancel()


def route(provider: str, base_url: str) -> ModelRoute:
    access = ProviderAccess(provider=provider, model="m", api_key=REAL_KEY, base_url=base_url)
    return ModelRoute.of(access)


async def exchange(socket_path: Path, *requests: bytes) -> bytes:
    """Send each request in turn on one connection, reading its whole answer (a chunked
    body's end, or the relay closing) within 2 s; everything that came back."""
    received = b""
    async with await anyio.connect_unix(socket_path) as stream:
        for request in requests:
            await stream.send(request)
            answer = b""
            with anyio.move_on_after(2):
                while not answer.endswith(b"\r\n0\r\n\r\n"):
                    try:
                        answer += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return received + answer
            received += answer
    return received


def post(target: str, **headers: str) -> bytes:
    body = b'{"model": "m"}'
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1:3128", f"Content-Length: {len(body)}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_the_cli_gets_the_relay_url_over_plain_http_whatever_the_endpoint() -> None:
    anthropic = route("anthropic", "https://api.anthropic.com")
    openai = route("openai", "https://api.openai.com/v1/")

    assert anthropic.inside_url == f"http://127.0.0.1:{RELAY_PORT}"
    assert openai.inside_url == f"http://127.0.0.1:{RELAY_PORT}/v1"
    assert route("openai", "http://10.0.0.5:8000/v1").base_url == "http://10.0.0.5:8000/v1"
    assert REAL_KEY not in repr(anthropic) and REAL_KEY not in repr(openai)


async def test_the_relay_swaps_the_placeholder_for_the_anthropic_key(tmp_path: Path) -> None:
    async with endpoint() as (port, received):
        socket_path = tmp_path / "model.sock"
        async with model_forwarder(
            socket_path, route("anthropic", f"http://127.0.0.1:{port}"), "t-egress"
        ):
            answer = await exchange(
                socket_path,
                post(
                    "/v1/messages?beta=true",
                    x_api_key=PLACEHOLDER_KEY,
                    Authorization=f"Bearer {PLACEHOLDER_KEY}",
                    anthropic_version="2023-06-01",
                ),
            )

    [seen] = received
    headers = dict(seen["headers"])
    assert seen["target"] == "/v1/messages?beta=true" and seen["body"] == '{"model": "m"}'
    assert headers["x-api-key"] == REAL_KEY and "authorization" not in headers
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["host"] == f"127.0.0.1:{port}"
    assert PLACEHOLDER_KEY not in json.dumps(seen)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in answer
    assert REAL_KEY.encode() in answer  # the endpoint's echo, streamed back through the relay


async def test_the_relay_sends_openai_keys_as_a_bearer_token_on_one_connection(
    tmp_path: Path,
) -> None:
    async with endpoint() as (port, received):
        socket_path = tmp_path / "model.sock"
        async with model_forwarder(
            socket_path, route("openai", f"http://127.0.0.1:{port}/v1"), "t-egress"
        ):
            await exchange(
                socket_path,
                post("/v1/chat/completions", Authorization=f"Bearer {PLACEHOLDER_KEY}"),
                post("/v1/chat/completions", api_key=PLACEHOLDER_KEY),
            )

    assert len(received) == 2  # two requests on one kept-alive connection
    for seen in received:
        headers = dict(seen["headers"])
        assert headers["authorization"] == f"Bearer {REAL_KEY}"
        assert "api-key" not in headers and "x-api-key" not in headers


async def test_the_relay_passes_each_piece_of_a_stream_on_as_it_comes(tmp_path: Path) -> None:
    release = anyio.Event()
    async with endpoint(release) as (port, _):
        socket_path = tmp_path / "model.sock"
        async with (
            model_forwarder(
                socket_path, route("anthropic", f"http://127.0.0.1:{port}"), "t-egress"
            ),
            await anyio.connect_unix(socket_path) as stream,
        ):
            await stream.send(post("/v1/messages"))
            received = b""
            with anyio.fail_after(3):  # the endpoint holds the rest back until then
                while b'{"target": "/v1/messages"' not in received:
                    received += await stream.receive()
            release.set()
            with anyio.fail_after(3):
                while not received.endswith(b"\r\n0\r\n\r\n"):
                    received += await stream.receive()

    assert b'"body": "{\\"model\\": \\"m\\"}"}' in received


async def test_the_relay_refuses_anything_but_the_endpoints_api(tmp_path: Path) -> None:
    async with endpoint() as (port, received):
        socket_path = tmp_path / "model.sock"
        async with model_forwarder(
            socket_path, route("openai", f"http://127.0.0.1:{port}/v1"), "t-egress"
        ):
            refused = [
                await exchange(socket_path, request)
                for request in (
                    post("http://evil.example/v1/chat/completions"),  # another host
                    b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",
                    post("/v2/other"),  # outside the endpoint's path
                    post("/v1/../admin"),
                )
            ]

    assert received == []
    for answer in refused:
        assert answer.startswith(b"HTTP/1.1 403 "), answer


async def test_an_unreachable_endpoint_answers_502(tmp_path: Path) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()  # nothing listens there any more
    socket_path = tmp_path / "model.sock"
    async with model_forwarder(
        socket_path, route("anthropic", f"http://127.0.0.1:{port}"), "t-egress"
    ):
        answer = await exchange(socket_path, post("/v1/messages"))

    assert answer.startswith(b"HTTP/1.1 502 ")
