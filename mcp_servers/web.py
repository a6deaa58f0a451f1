"""MCP server ``web``: fetch a public web page as readable text, SSRF-safe.

Run ``python -m mcp_servers.web [--host H] [--port 8102] [--stdio] [--timeout-s 20]``.
Every hop of a fetch (the URL and each redirect, at most five, followed here rather
than by the HTTP client) is vetted, and the address each connection really uses is
vetted again by ``VettingNetworkBackend``. ``MCP_WEB_ALLOW_NETWORKS`` opens chosen
internal networks (operator escape hatch, empty by default).

A private task's capability (``CAPABILITY_KEY``) carries where its reads may go (the scope
claim's ``egress``: the links its person gave, the operator's allowlist); the URL and
every redirect hop must pass that rule before a request leaves, whoever sent the call.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio
import httpx2
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers._html import readable_html
from mcp_servers._identity import Caller, Identity
from mcp_servers._serving import (
    add_tools,
    argument_parser,
    identity_or_exit,
    log_event,
    logged_tool_call,
    serve,
)
from mcp_servers._ssrf import AddressPolicy, AddressRefused, VettedTransport
from worker._version import package_version
from worker.tools import Reach, origin_of
from worker.tracing import TracingTransport

DEFAULT_PORT = 8102
DEFAULT_MAX_BYTES = 200_000
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "hub-agent-worker-web/0.1 (MCP fetch tool)"
# The grant each tool requires; a capability must hold it (MCP_CONFIG maps the same).
TOOL_GRANTS = {"fetch": "web:read"}

# A caller without a scope (development mode, a capability from before scopes): unbounded.
ANYWHERE = Reach.anywhere()

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {"application/json", "application/xml", "application/javascript", "application/x-yaml",
     "application/yaml", "application/toml", "application/x-ndjson"}
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchLimits:
    """How long and how much one fetch may take; ``max_bytes`` asked by the model is capped."""

    timeout_s: float = 20.0
    max_redirects: int = 5
    hard_max_bytes: int = 2_000_000
    parse_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    url: str
    status: int
    content_type: str
    body: bytes
    encoding: str
    truncated_at: int | None

    async def readable(self, *, parse_timeout_s: float) -> str:
        """Header lines (URL, status, type, title) and the body as plain text.

        HTML is parsed off the event loop, for at most ``parse_timeout_s``.
        """
        text = self.body.decode(self.encoding, errors="replace")
        title, note = "", None
        if _kind_of(self.content_type, self.body) == "html":
            parsed = await readable_html(text, timeout_s=parse_timeout_s)
            title, text, note = parsed.title, parsed.text, parsed.note
        lines = [f"URL: {self.url}", f"Status: {self.status}", f"Content-Type: {self.content_type}"]
        if title:
            lines.append(f"Title: {title}")
        lines.extend(["", text.strip() or "(no readable text)"])
        if self.truncated_at is not None:
            lines.append(f"\n[truncated: only the first {self.truncated_at} bytes were read]")
        if note is not None:
            lines.append(f"\n[note: {note}]")
        return "\n".join(lines)


class Fetcher:
    """One HTTP client for the whole server process; use as an async context manager."""

    def __init__(
        self,
        policy: AddressPolicy,
        limits: FetchLimits = FetchLimits(),
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._policy = policy
        self._limits = limits
        self._client = httpx2.AsyncClient(
            # Each fetch a client span; the URL the model chose stays out of it.
            transport=TracingTransport(transport or VettedTransport(policy), record_path=False),
            trust_env=False,  # an env proxy would connect to addresses we never vetted
            follow_redirects=False,  # followed in _follow, so each hop is vetted
            timeout=limits.timeout_s,
            headers={
                "User-Agent": USER_AGENT,
                "Accept": "text/html, text/*;q=0.9, application/json;q=0.8, */*;q=0.1",
                # Uncompressed, so max_bytes also bounds what gets decompressed.
                "Accept-Encoding": "identity",
            },
        )

    async def __aenter__(self) -> Self:
        await self._client.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._client.__aexit__(exc_type, exc, traceback)

    @property
    def limits(self) -> FetchLimits:
        return self._limits

    async def fetch(
        self,
        url: str,
        *,
        max_bytes: int,
        timeout_s: float | None = None,
        reach: Reach = ANYWHERE,
        on_refused: Callable[[str], None] = lambda url: None,
    ) -> Page:
        """The page at ``url`` after redirects; raise ToolError with a message for the model.

        ``timeout_s`` (the caller's time left) shortens the configured timeout; ``reach``
        bounds the URL and every hop (``on_refused`` hears of the one it stops).
        """
        if max_bytes < 1:
            raise ToolError("max_bytes must be at least 1")
        max_bytes = min(max_bytes, self._limits.hard_max_bytes)
        limit_s = min(self._limits.timeout_s, timeout_s or self._limits.timeout_s)
        try:
            with anyio.fail_after(limit_s):
                return await self._follow(url, max_bytes, reach, on_refused)
        except TimeoutError:
            raise ToolError(f"timed out after {limit_s:g} s fetching {url}") from None

    async def _follow(
        self, url: str, max_bytes: int, reach: Reach, on_refused: Callable[[str], None]
    ) -> Page:
        current, came_from = url, None
        for _hop in range(self._limits.max_redirects + 1):
            if not reach.allows(current):
                on_refused(current)
                # Trusted text only: neither the URL nor a redirect's target is echoed.
                hop = " (a redirect)" if came_from else ""
                raise ToolError(f"{reach.refusal_message()}{hop}")
            try:
                self._policy.check_url(current)
                async with self._client.stream("GET", current) as response:
                    location = _redirect_target(response)
                    if location is None:
                        return await _read(response, max_bytes)
            except AddressRefused as refusal:
                suffix = f" (redirected from {came_from})" if came_from else ""
                raise ToolError(f"{refusal}{suffix}") from None
            except httpx2.InvalidURL as exc:
                raise ToolError(f"refused: not a valid URL ({exc})") from None
            except httpx2.TimeoutException:
                raise ToolError(f"timed out fetching {current}") from None
            except httpx2.HTTPError as exc:
                raise ToolError(f"could not fetch {current}: {exc or type(exc).__name__}") from None
            came_from, current = current, location
        raise ToolError(f"too many redirects (more than {self._limits.max_redirects}) from {url}")


def _redirect_target(response: httpx2.Response) -> str | None:
    if response.status_code not in REDIRECT_STATUSES:
        return None
    location = response.headers.get("location")
    if not location:
        return None
    return str(response.url.join(location))


async def _read(response: httpx2.Response, max_bytes: int) -> Page:
    url = str(response.url)
    if response.status_code >= 400:
        raise ToolError(f"HTTP {response.status_code} {response.reason_phrase} from {url}")
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type and _kind_of(content_type, b"") == "binary":
        raise ToolError(f"refused: {url} is {content_type}; only HTML and text are returned")
    body = bytearray()
    truncated_at = None
    async for chunk in response.aiter_bytes():
        if len(body) + len(chunk) > max_bytes:
            body += chunk[: max_bytes - len(body)]
            truncated_at = max_bytes
            break
        body += chunk
    if _kind_of(content_type, bytes(body[:1024])) == "binary":
        raise ToolError(f"refused: {url} is binary content; only HTML and text are returned")
    return Page(
        url=url,
        status=response.status_code,
        content_type=content_type or "unknown",
        body=bytes(body),
        encoding=_usable_encoding(response.charset_encoding),
        truncated_at=truncated_at,
    )


def _kind_of(content_type: str, head: bytes) -> str:
    """``html``, ``text`` or ``binary``; without a declared type, guessed from the first bytes."""
    if content_type in _HTML_TYPES:
        return "html"
    if (
        content_type.startswith("text/")
        or content_type in _TEXT_TYPES
        or content_type.endswith(("+json", "+xml"))
    ):
        return "text"
    if content_type and content_type != "unknown":
        return "binary"
    if b"\x00" in head:
        return "binary"
    return "html" if b"<html" in head.lower() or b"<!doctype html" in head.lower() else "text"


def _usable_encoding(declared: str | None) -> str:
    if declared:
        try:
            "".encode(declared)
        except LookupError:
            return "utf-8"
        return declared
    return "utf-8"


@dataclass(frozen=True, slots=True, kw_only=True)
class WebAccess:
    """What the fetch tool shares for the life of the server process."""

    fetcher: Fetcher
    identity: Identity


async def fetch(url: str, ctx: Context[WebAccess, Any], max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Read a web page: fetch a URL and return the page's readable text.

    Use it for a link you are asked to read, open or check. HTML is reduced to plain
    text (title first; scripts, styles and markup removed). Plain text, JSON, XML and
    other text types come back as they are; images, PDFs and other binary content are
    refused. The server itself refuses the addresses its operator has not allowed,
    and says so. Redirects are followed (at most 5). Long pages are cut at max_bytes
    and say so.

    Args:
        url: The page's absolute http:// or https:// URL, as you were given it.
        max_bytes: Read at most this many bytes of the body (at most 2000000).
    """
    web = ctx.request_context.lifespan_context
    limits = web.fetcher.limits
    with logged_tool_call(server="web", tool="fetch", identity=web.identity, ctx=ctx) as caller:
        reach = ANYWHERE if caller is None or caller.scope is None else caller.scope.reach
        page = await web.fetcher.fetch(
            url,
            max_bytes=max_bytes,
            timeout_s=_time_left(caller, limits.timeout_s),
            reach=reach,
            on_refused=lambda refused: _log_refusal(caller, refused),
        )
        return await page.readable(parse_timeout_s=_time_left(caller, limits.parse_timeout_s))


def _log_refusal(caller: Caller | None, url: str) -> None:
    log_event(
        "scope_refused",
        level=logging.WARNING,
        server="web",
        tool="fetch",
        agent=None if caller is None else caller.agent_id,
        task=None if caller is None else caller.task_id,
        reason="egress_not_allowed",
        target=origin_of(url),
    )


def _time_left(caller: Caller | None, cap_s: float) -> float:
    return cap_s if caller is None else caller.time_left(cap_s)


def build_server(
    *,
    policy: AddressPolicy,
    limits: FetchLimits = FetchLimits(),
    identity: Identity | None = None,
) -> MCPServer[WebAccess]:
    """The ``web`` MCPServer with its ``fetch`` tool; one Fetcher per server run.

    ``identity`` None: development mode (the caller named in ``_meta`` is trusted).
    """
    checked = identity or Identity(tool_grants=TOOL_GRANTS)

    @asynccontextmanager
    async def one_fetcher(_server: MCPServer[WebAccess]) -> AsyncIterator[WebAccess]:
        async with Fetcher(policy, limits) as fetcher:
            yield WebAccess(fetcher=fetcher, identity=checked)

    server: MCPServer[WebAccess] = MCPServer(
        "web",
        version=package_version(),
        instructions="Fetch public web pages as readable text.",
        lifespan=one_fetcher,
    )
    add_tools(server, fetch)
    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argument_parser("web", DEFAULT_PORT)
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=FetchLimits().timeout_s,
        help="total time one fetch may take, redirects included (default: %(default)s)",
    )
    options = parser.parse_args(argv)
    try:
        policy = AddressPolicy.from_env()
    except ValueError as exc:
        print(f"mcp_servers.web: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    server = build_server(
        policy=policy,
        limits=FetchLimits(timeout_s=options.timeout_s),
        identity=identity_or_exit("web", TOOL_GRANTS),
    )
    serve(server, default_port=DEFAULT_PORT, options=options)


if __name__ == "__main__":
    main()
