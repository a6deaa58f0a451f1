"""The HTTP endpoint of the worker parent: ``/metrics`` (Prometheus text) and ``/healthz``."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from redis import Redis
from redis.exceptions import RedisError

from worker._signals import signals_left_to_the_main_thread
from worker.logs import log_event

PORT_SEARCH_SPAN = 16

_running: list[_MetricsHTTPServer] = []
_running_lock = threading.Lock()
_fork_hook_installed = False


class _MetricsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        redis_factory: Callable[[], Redis],
    ) -> None:
        super().__init__(address, _Handler)
        self.registry = registry
        self.redis_factory = redis_factory

    def redis_answers(self) -> bool:
        try:
            return bool(self.redis_factory().ping())
        except RedisError:
            return False


class _Handler(BaseHTTPRequestHandler):
    server: _MetricsHTTPServer

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            # OpenMetrics when the scraper asks for it (Prometheus does): it carries exemplars.
            encode, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(200, encode(self.server.registry), content_type)
        elif path == "/healthz":
            if self.server.redis_answers():
                self._answer(200, b"ok\n")
            else:
                self._answer(503, b"redis unreachable\n")
        else:
            self._answer(404, b"not found: try /metrics or /healthz\n")

    def _answer(
        self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Scrapes every few seconds would drown the task events.
        pass


def start_server(
    port: int, *, host: str, registry: CollectorRegistry, redis_factory: Callable[[], Redis]
) -> int | None:
    """Bind ``port``, or the next free one up to ``port + 16``, and serve in a daemon thread."""
    _install_fork_hook()
    last_port = min(port + PORT_SEARCH_SPAN, 65_535)
    for candidate in range(port, last_port + 1):
        try:
            server = _MetricsHTTPServer((host, candidate), registry, redis_factory)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                continue
            raise
        serving = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        with signals_left_to_the_main_thread():
            serving.start()
        with _running_lock:
            _running.append(server)
        if candidate != port:
            log_event("metrics_port_taken", level="warning", wanted_port=port, port=candidate)
        log_event("metrics_server_started", port=candidate, host=host)
        return candidate
    log_event(
        "metrics_server_disabled",
        level="error",
        reason=f"ports {port}-{last_port} are all taken",
    )
    return None


def stop_servers() -> None:
    with _running_lock:
        servers = list(_running)
        _running.clear()
    for server in servers:
        server.shutdown()
        server.server_close()


def _install_fork_hook() -> None:
    global _fork_hook_installed
    if not _fork_hook_installed:
        os.register_at_fork(after_in_child=_forget_servers_in_child)
        _fork_hook_installed = True


def _forget_servers_in_child() -> None:
    # A job process or rq's scheduler process must not keep the parent's port
    # open: a job outliving its parent would hold it for the next worker.
    for server in _running:
        server.socket.close()
    _running.clear()
