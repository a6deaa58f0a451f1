"""The real ``web`` MCP server, over stdio and streamable HTTP, against a local HTTP server."""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import version

import anyio
import anyio.to_thread
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from tests.support.mcp_servers import caller_meta, mcp_http_session, running_mcp, text_of
from worker.dev.post_proxy import LoopbackServer, serving

pytestmark = pytest.mark.integration

LOOPBACK_ONLY = "127.0.0.1/32"
CALLER_META = caller_meta("web-agent", task_id="t-web")

ARTICLE = b"""<!doctype html>
<html><head><title>Release notes</title>
<style>body { color: red }</style>
<script>window.secretTracker = "do-not-show";</script></head>
<body><h1>Version 2.0</h1>
<p>Faster   startup and
   smaller images.</p>
<ul><li>first change</li><li>second change</li></ul>
<noscript>enable javascript</noscript>
</body></html>"""
# A token placed far past any small max_bytes, to prove reading stopped early.
LONG_TEXT = b"a" * 40_000 + b" LATE-MARKER " + b"b" * 10_000
# html.parser is quadratic on this: 400 KB of it once took 12 s of one CPU.
HOSTILE_HTML = b"<html><title>Trap</title>READABLE-START " + b"</" * 900_000
# Set when the site has sent the hostile page: the web server is parsing it from then on.
HOSTILE_SENT = threading.Event()


class _SiteHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/article":
            self._answer(200, "text/html; charset=utf-8", ARTICLE)
        elif self.path == "/long.txt":
            self._answer(200, "text/plain", LONG_TEXT)
        elif self.path == "/hostile":
            self._answer(200, "text/html", HOSTILE_HTML)
            HOSTILE_SENT.set()
        elif self.path == "/logo.png":
            self._answer(200, "image/png", b"\x89PNG\r\n\x1a\n\x00\x00")
        elif self.path == "/moved":
            self._redirect("/article")
        elif self.path == "/to-metadata":
            self._redirect("http://169.254.169.254/latest/meta-data/")
        elif self.path == "/to-other-loopback":
            self._redirect(f"http://127.0.0.2:{self.connection.getsockname()[1]}/article")
        else:
            self._answer(404, "text/plain", b"no such page")

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Site:
    base_url: str


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with serving(LoopbackServer(_SiteHandler)) as server:
        yield Site(base_url=server.url)


@asynccontextmanager
async def stdio_web_session(*, allow_networks: str | None) -> AsyncIterator[ClientSession]:
    env = {"MCP_WEB_ALLOW_NETWORKS": allow_networks} if allow_networks else {}
    parameters = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_servers.web", "--stdio"], env=env
    )
    async with (
        stdio_client(parameters) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream) as session,
    ):
        await session.initialize()
        yield session


@pytest.mark.anyio
async def test_an_html_page_comes_back_as_readable_text(site: Site) -> None:
    async with stdio_web_session(allow_networks=LOOPBACK_ONLY) as session:
        result = await session.call_tool(
            "fetch", {"url": f"{site.base_url}/article"}, meta=CALLER_META
        )

    text = text_of(result)
    assert not result.is_error, text
    assert "Title: Release notes" in text
    assert "Version 2.0\nFaster startup and smaller images.\n- first change\n- second change" in (
        text
    )
    assert "secretTracker" not in text
    assert "color: red" not in text
    assert "enable javascript" not in text
    assert "<p>" not in text


@pytest.mark.anyio
async def test_redirects_are_followed_and_every_hop_is_vetted(site: Site) -> None:
    async with stdio_web_session(allow_networks=LOOPBACK_ONLY) as session:
        followed = await session.call_tool("fetch", {"url": f"{site.base_url}/moved"})
        to_metadata = await session.call_tool("fetch", {"url": f"{site.base_url}/to-metadata"})
        to_other = await session.call_tool("fetch", {"url": f"{site.base_url}/to-other-loopback"})

    assert not followed.is_error
    assert f"URL: {site.base_url}/article" in text_of(followed)
    assert to_metadata.is_error
    assert "refused: 169.254.169.254 is a cloud metadata address" in text_of(to_metadata)
    assert f"redirected from {site.base_url}/to-metadata" in text_of(to_metadata)
    # The escape hatch opens exactly 127.0.0.1, not the rest of loopback.
    assert to_other.is_error
    assert "refused: 127.0.0.2 is a loopback address" in text_of(to_other)


@pytest.mark.anyio
async def test_loopback_is_refused_without_the_escape_hatch(site: Site) -> None:
    async with stdio_web_session(allow_networks=None) as session:
        result = await session.call_tool("fetch", {"url": f"{site.base_url}/article"})

    assert result.is_error
    assert "refused: 127.0.0.1 is a loopback address" in text_of(result)


@pytest.mark.anyio
async def test_max_bytes_stops_reading_and_says_so(site: Site) -> None:
    async with stdio_web_session(allow_networks=LOOPBACK_ONLY) as session:
        cut = await session.call_tool(
            "fetch", {"url": f"{site.base_url}/long.txt", "max_bytes": 1000}
        )
        whole = await session.call_tool(
            "fetch", {"url": f"{site.base_url}/long.txt", "max_bytes": 100_000}
        )

    cut_text = text_of(cut)
    assert not cut.is_error
    assert "a" * 1000 in cut_text
    assert "a" * 1001 not in cut_text
    assert "LATE-MARKER" not in cut_text
    assert "[truncated: only the first 1000 bytes were read]" in cut_text
    assert "LATE-MARKER" in text_of(whole)
    assert "truncated" not in text_of(whole)


@pytest.mark.anyio
async def test_binary_content_and_http_errors_are_readable_errors(site: Site) -> None:
    async with stdio_web_session(allow_networks=LOOPBACK_ONLY) as session:
        image = await session.call_tool("fetch", {"url": f"{site.base_url}/logo.png"})
        missing = await session.call_tool("fetch", {"url": f"{site.base_url}/missing"})

    assert image.is_error
    assert "image/png; only HTML and text are returned" in text_of(image)
    assert missing.is_error
    assert f"HTTP 404 Not Found from {site.base_url}/missing" in text_of(missing)


@pytest.mark.anyio
async def test_the_model_sees_one_fetch_tool_with_url_and_max_bytes() -> None:
    async with stdio_web_session(allow_networks=None) as session:
        listed = await session.list_tools()

    assert [tool.name for tool in listed.tools] == ["fetch"]
    schema = listed.tools[0].input_schema
    assert set(schema["properties"]) == {"url", "max_bytes"}
    assert schema["required"] == ["url"]
    description = " ".join((listed.tools[0].description or "").split())
    assert description.startswith("Read a web page: fetch a URL and return")
    # The model is told the server, not its own judgement, refuses what is not allowed,
    # and is given no list of refused kinds to match a link against (a small model
    # declined to fetch a loopback link the operator allowed).
    assert "The server itself refuses the addresses its operator has not allowed" in description
    assert "loopback" not in description


@pytest.mark.anyio
async def test_over_http_with_a_bearer_token(site: Site) -> None:
    with running_mcp(
        "web", auth_token="web-token-for-tests", allow_networks=LOOPBACK_ONLY
    ) as server:
        async with mcp_http_session(server.url, auth_token="web-token-for-tests") as session:
            info = (await session.initialize()).server_info
            result = await session.call_tool("fetch", {"url": f"{site.base_url}/article"})
        log = server.stderr_text()

    assert not result.is_error
    assert (info.name, info.version) == ("web", version("hub-agent-worker"))
    assert "Title: Release notes" in text_of(result)
    assert "web-token-for-tests" not in log
    assert '"event": "tool_call"' in log


@pytest.mark.anyio
async def test_a_hostile_page_parses_off_the_loop_and_other_fetches_go_on(site: Site) -> None:
    """While one fetch parses a page built to make the parser quadratic, a second fetch
    is served; the hostile one still answers, with its tags stripped roughly."""
    finished: list[str] = []
    results: dict[str, CallToolResult] = {}
    HOSTILE_SENT.clear()
    with running_mcp("web", allow_networks=LOOPBACK_ONLY) as server:
        async with mcp_http_session(server.url) as session:

            async def fetch(name: str, path: str) -> None:
                arguments = {"url": f"{site.base_url}{path}", "max_bytes": 2_000_000}
                results[name] = await session.call_tool("fetch", arguments)
                finished.append(name)

            async with anyio.create_task_group() as fetches:
                fetches.start_soon(fetch, "hostile", "/hostile")
                await anyio.to_thread.run_sync(HOSTILE_SENT.wait, 60)
                fetches.start_soon(fetch, "plain", "/long.txt")

    assert finished == ["plain", "hostile"]
    assert "LATE-MARKER" in text_of(results["plain"])
    hostile = text_of(results["hostile"])
    assert not results["hostile"].is_error, hostile
    assert "READABLE-START" in hostile
    assert "only the first 500000 characters of the page were parsed" in hostile
    assert "too costly to parse" in hostile
