"""A recording proxy in front of the model: every chat completion, request and answer.

``make eval`` with ``REALMODEL_RECORD=path.jsonl`` puts it between the worker and
llama-server; each line of the file is one ``{"request": ..., "response": ...}`` exchange,
which the tests replay as recorded real outputs.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from worker.dev.devstack import free_port

_TIMEOUT_S = 600


@contextmanager
def recording_proxy(upstream: str, record: Path) -> Iterator[str]:
    """Forward POSTs under ``upstream`` (ending in /v1) and log them; yields the proxy's /v1."""
    lock = threading.Lock()

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            target = upstream.removesuffix("/v1") + self.path
            forwarded = urllib.request.Request(
                target, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(forwarded, timeout=_TIMEOUT_S) as answer:
                    status, payload = answer.status, answer.read()
            except urllib.error.HTTPError as error:
                status, payload = error.code, error.read()
            with lock, record.open("a") as log:
                log.write(json.dumps(_exchange(body, status, payload)) + "\n")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.shutdown()
        server.server_close()


def exchanges(record: Path) -> list[dict[str, Any]]:
    """The exchanges a recording holds, in the order they were made."""
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def _exchange(request: bytes, status: int, response: bytes) -> dict[str, Any]:
    try:
        answer: Any = json.loads(response)
    except ValueError:
        answer = response.decode(errors="replace")
    return {"request": json.loads(request), "status": status, "response": answer}
