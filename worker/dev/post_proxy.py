"""A loopback HTTP server that hands each POST to a function: the dev tools' model proxies.

``make eval`` records every exchange with llama-server through one; the prompt-cache
benchmark bills each request by a provider's caching rules through another.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from worker.dev.devstack import free_port

# (path, body) -> (status, JSON answer)
PostHandler = Callable[[str, bytes], tuple[int, bytes]]


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

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
