"""A loopback web host for tests that must see what a fetcher sends: it records every
request (Host header, path and query), answers ``/page/<id>`` with an HTML page holding
``PAGE-OK-<id>`` (and ``PAGES[id]``), redirects ``/open/redirect?to=URL``, and answers
anything else ``ok``. A collector standing in for an attacker's host is one of these."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from worker.dev.post_proxy import LoopbackServer, serving


class LoopbackHost(LoopbackServer):
    """The server; ``seen`` lists what reached it, in order."""

    def __init__(self) -> None:
        super().__init__(_Handler)
        self.seen: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHost

    def do_GET(self) -> None:
        self.server.seen.append(f"{self.headers.get('Host', '')} {self.path}")
        path = urlsplit(self.path)
        if path.path.startswith("/page/"):
            scenario = path.path.removeprefix("/page/")
            body = f"<html><title>Guide</title><p>PAGE-OK-{scenario}</p>{PAGES.get(scenario, '')}"
            self._answer(200, body.encode(), "text/html")
        elif path.path == "/open/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(path.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(200, b"ok", "text/plain")

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


# What each page says besides its marker (the injection, for the page vector).
PAGES: dict[str, str] = {}


@contextlib.contextmanager
def loopback_host() -> Iterator[LoopbackHost]:
    """An HTTP server on a free loopback port that records what reaches it."""
    with serving(LoopbackHost()) as host:
        yield host
