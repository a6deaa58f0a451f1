"""A test MCP server whose tools echo, add, hang, crash, fail and return huge or binary output.

Run: ``python -m tests.support.mcp_test_servers.toolkit --stdio`` or ``... --port <port>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
from mcp.server.mcpserver import Audio, Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, EmbeddedResource, TextResourceContents

from mcp_servers._serving import serve

server = MCPServer("toolkit")


@server.tool()
def echo(text: str, ctx: Context) -> str:
    """Return the text and the request _meta the server received, as JSON."""
    meta = dict(ctx.request_context.meta or {})
    return json.dumps({"text": text, "meta": meta})


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for the given number of seconds, then answer."""
    # A test that stops the server mid-call waits for this line.
    print(f"slow started: {seconds}", file=sys.stderr, flush=True)
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def pid() -> str:
    """Return the server's process id."""
    return str(os.getpid())


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool ``name`` (it answers its own name) and tell listening clients."""

    def grown() -> str:
        return name

    server.add_tool(grown, name=name, description=f"The tool {name}, added at run time.")
    await ctx.notify_tools_changed()
    return f"added {name}"


@server.tool()
def crash() -> str:
    """Kill the server process at once, as a crashing server would."""
    os._exit(1)


@server.tool()
def crash_leaving_helper() -> str:
    """Start a helper that shrugs off SIGTERM in the server's process group, then crash.

    The pool's stop of the crashed server then lasts the whole kill grace.
    """
    subprocess.Popen(
        [sys.executable, "-c", _STUBBORN_HELPER],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os._exit(1)


_STUBBORN_HELPER = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
)


@server.tool()
def fail(reason: str) -> str:
    """Fail with a message the model should read."""
    raise ToolError(reason)


@server.tool()
def huge(megabytes: int) -> str:
    """Return a text of the given size in megabytes."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
def media() -> list[Image | Audio | EmbeddedResource]:
    """Return an image, an audio clip and an embedded binary resource."""
    return [
        Image(data=b"\x89PNG" + bytes(1020), format="png"),
        Audio(data=bytes(2048), format="wav"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="file:///notes.txt", mime_type="text/plain", text="hi"
            ),
        ),
    ]


@server.tool()
def structured_only() -> CallToolResult:
    """Return structured content without any text block."""
    return CallToolResult(content=[], structured_content={"answer": 42, "unit": "items"})


@server.tool(name="dotted.name")
def dotted_name() -> str:
    """A tool whose name no model provider accepts."""
    return "unreachable"


if __name__ == "__main__":
    serve(server, default_port=0)
