"""Loopback HTTP servers for the dev tools: ``serving(LoopbackServer(Handler))`` runs a
handler on a free loopback port until the block ends; ``post_proxy`` hands each POST to a
function, the dev tools' model proxies.

``make eval`` records every exchange with llama-server through one and serves the page its
fetch scenario reads through another; the prompt-cache benchmark bills each request by a
provider's caching rules through a third. The tests' own loopback servers are these too.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseRequestHandler
from typing import Any, TypeVar

# (path, body) -> (status, JSON answer)
PostHandler = Callable[[str, bytes], tuple[int, bytes]]


class LoopbackServer(ThreadingHTTPServer):
    """``handler`` bound to a free port of 127.0.0.1; ``url`` is its root, without a slash."""

    daemon_threads = True  # a client left hanging does not hold the server's close

    def __init__(self, handler: Callable[..., BaseRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


Server = TypeVar("Server", bound=LoopbackServer)


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    """Serve ``server`` from a daemon thread until the block ends, then close it."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def post_proxy(handle: PostHandler) -> Iterator[str]:
    """Serve ``handle`` on a free loopback port; yields the server's root URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status, payload = handle(self.path, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return  # the callers print their own results

    with serving(LoopbackServer(Handler)) as server:
        yield server.url


def forward_post(url: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
    """POST a JSON ``body`` to ``url``; the status and body of the answer, errors included."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
