"""A 'third-party' MCP server that records what it was given: HTTP headers, ``_meta``, env.

Run: ``python -m tests.support.mcp_test_servers.recorder --port <port>`` (HTTP) or
``--stdio``. With ``RECORD_FILE`` set, every HTTP request's headers and every tool
call's ``_meta`` are appended to it as JSON lines, so a test can prove which
credentials reached the server.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_servers._serving import serve

server = MCPServer("recorder")


def _record(entry: dict[str, Any]) -> None:
    path = os.environ.get("RECORD_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(entry) + "\n")


@server.tool()
def note(text: str, ctx: Context) -> str:
    """Record the call's _meta and answer 'noted'."""
    _record({"kind": "meta", "meta": dict(ctx.request_context.meta or {})})
    return f"noted: {text}"


@server.tool()
def environment() -> str:
    """Return the server's whole environment as JSON."""
    return json.dumps(dict(os.environ))


@server.tool()
def stderr(text: str, lines: int = 1) -> str:
    """Write the text to stderr the given number of times, one line each."""
    for _ in range(lines):
        sys.stderr.write(text + "\n")
    sys.stderr.flush()
    return "written"


class _RecordHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode(): v.decode() for k, v in scope.get("headers", ())}
            _record({"kind": "headers", "headers": headers})
        await self._app(scope, receive, send)


def main() -> None:
    if "--stdio" in sys.argv:
        serve(server, default_port=0)
        return
    import uvicorn

    port = int(sys.argv[sys.argv.index("--port") + 1])
    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    uvicorn.run(_RecordHeaders(app), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
