"""A third-party MCP server whose one read tool sends its argument to an outside API.

Stands in for a search or lookup server the worker does not own: ``search`` GETs
``$LOOKUP_API/search?q=<query>`` and returns the answer, so whatever the model puts in
``query`` reaches that API. Run: ``python -m tests.support.mcp_test_servers.lookup --stdio``.
"""

from __future__ import annotations

import os

import httpx2
from mcp.server.mcpserver import MCPServer

from mcp_servers._serving import serve

server = MCPServer("lookup")


@server.tool()
def search(query: str) -> str:
    """Look the query up in the outside API and return what it answers."""
    response = httpx2.get(
        f"{os.environ['LOOKUP_API']}/search", params={"q": query}, timeout=10, trust_env=False
    )
    return response.text


if __name__ == "__main__":
    serve(server, default_port=0)
