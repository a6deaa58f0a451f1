"""The toolkit as a server of the 2025 handshake only: it refuses ``server/discover``, so a
client falls back to ``initialize`` and gets a session id, which a restart forgets (the
server then answers that id with HTTP 404, as the streamable-HTTP spec says).

Run: ``python -m tests.support.mcp_test_servers.legacy_toolkit --port <port>``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import uvicorn
from mcp_types import METHOD_NOT_FOUND
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_servers._serving import build_http_app
from tests.support.mcp_test_servers.toolkit import server


class RefuseDiscover:
    """ASGI middleware: ``server/discover`` is a method this server does not know."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        body = await _whole_body(receive)
        message: Any = _json_or_none(body)
        if isinstance(message, dict) and message.get("method") == "server/discover":
            error = {"code": METHOD_NOT_FOUND, "message": "Method not found: server/discover"}
            await _send_json(send, {"jsonrpc": "2.0", "id": message.get("id"), "error": error})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self._app(scope, replay, send)


async def _whole_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


async def _send_json(send: Send, value: Any) -> None:
    body = json.dumps(value).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    token = os.environ.get("MCP_AUTH_TOKEN") or None
    app = RefuseDiscover(build_http_app(server, host="127.0.0.1", auth_token=token))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
