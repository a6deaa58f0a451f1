"""What a concurrent worker's task costs in connections and CPU (docs/connections.md).

Real redis-server, the devhub, the MCP servers and the scripted model endpoint; one
``rq worker`` with WORKER_CONCURRENCY=4 runs three-step notifications. After warm-up
tasks, the table shows per measured task: the worker's CPU, the model requests, and
the new connections the model endpoint saw (distinct client ports of those requests).

The TLS row puts the devhub, the model endpoint and mcp-hub behind a TLS proxy in this process
(a self-signed certificate made with openssl, which the worker trusts through
SSL_CERT_FILE); the proxy counts the connections it accepted, each a full handshake.
Run it on two checkouts to put one code's figures beside another's.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import yaml

from bench._procs import cpu_seconds
from bench._report import Table
from bench._size import Size
from bench._stack import (
    WORKER_RUN_TIMEOUT_S,
    bench_stack,
    job_times,
    require_completed,
    running_workers,
    wait_for_jobs,
)

CONCURRENCY = "4"


def benchmark(*, size: Size) -> list[Table]:
    warm_up = size.pick(full=8, quick=4, smoke=1)
    measured = size.pick(full=80, quick=24, smoke=2)
    table = Table(
        f"connections: WORKER_CONCURRENCY={CONCURRENCY}, 3-step notifications",
        [
            "transport",
            "tasks",
            "CPU ms per task",
            "model requests per task",
            "new model connections per task",
            "TLS handshakes per task (Hub, model, mcp-hub)",
            "first model byte, ms (median)",
        ],
    )
    with bench_stack() as bench:
        assert bench.stack.llm_base_url is not None
        llm_url = bench.stack.llm_base_url
        cpu_ms, requests, new_ports, _, _ = _window(bench, {}, llm_url, warm_up, measured)
        table.add("HTTP", measured, f"{cpu_ms:.1f}", requests, new_ports, "n/a", "n/a")
        mcp_hub_url = _mcp_hub_url(bench.stack.mcp_config)
        with tls_proxies(bench.stack.hub_url, llm_url, mcp_hub_url) as (hub, llm, mcp, ca_file):
            env = {
                "SSL_CERT_FILE": str(ca_file),
                "HUB_URL": hub.url,
                "OPENAI_BASE_URL": f"{llm.url}/v1",
                "ANTHROPIC_BASE_URL": llm.url,
                "MCP_CONFIG": str(
                    _behind(bench.stack.mcp_config, f"{mcp.url}/mcp", Path(str(ca_file)))
                ),
            }
            cpu_ms, requests, new_ports, handshakes, first_byte = _window(
                bench, env, llm_url, warm_up, measured, (hub, llm, mcp)
            )
        table.add("HTTPS", measured, f"{cpu_ms:.1f}", requests, new_ports, handshakes, first_byte)
    table.notes = [
        "CPU: user + system of the worker (/proc), from the end of the warm-up tasks to",
        "  the end of the measured ones. New connections: client ports the model endpoint",
        "  had not seen before the window (the window's requests may include the tail task's).",
        "HTTPS: the devhub, the model endpoint and mcp-hub each behind a TLS proxy (self-signed",
        "  certificate trusted through SSL_CERT_FILE); each connection a proxy accepts is one",
        "  handshake. First model byte: at the model's proxy, from a request's start (for the",
        "  first on a connection: the accept, so its handshake counts) to its answer's first byte.",
    ]
    return [table]


def _window(
    bench: Any,
    extra_env: dict[str, str],
    llm_url: str,
    warm_up: int,
    measured: int,
    proxies: tuple[_TlsProxy, ...] = (),
) -> tuple[float, str, str, str, str]:
    """CPU ms, model requests, new model connections and handshakes per measured task, and
    the median time to the first byte of a model answer (behind the proxies only)."""
    warm_ids = [task["task_id"] for task in bench.seed(warm_up)]
    measured_ids = [task["task_id"] for task in bench.seed(measured)]
    (tail,) = [task["task_id"] for task in bench.seed(1)]
    env = bench.worker_env(WORKER_CONCURRENCY=CONCURRENCY, **extra_env)
    with running_workers(env, 1, bench.redis) as pool:
        (pid,) = pool.pids
        wait_for_jobs(bench.redis, warm_ids, timeout_s=WORKER_RUN_TIMEOUT_S)
        before = cpu_seconds(pid)
        accepted = [proxy.accepted for proxy in proxies]
        answered = [len(proxy.first_byte_s) for proxy in proxies]
        seen = {r["client_port"] for r in _model_requests(llm_url)}
        count = len(_model_requests(llm_url))
        wait_for_jobs(bench.redis, measured_ids, timeout_s=WORKER_RUN_TIMEOUT_S)
        while bench.redis.hget(f"rq:job:{tail}", "status") in (None, b"queued"):
            time.sleep(0.01)
        spent = cpu_seconds(pid) - before
        handshakes = [p.accepted - n for p, n in zip(proxies, accepted, strict=True)]
        first_byte = [p.first_byte_s[n:] for p, n in zip(proxies, answered, strict=True)]
        window = _model_requests(llm_url)[count:]
        wait_for_jobs(bench.redis, [tail], timeout_s=WORKER_RUN_TIMEOUT_S)
    require_completed(job_times(bench.redis, [*warm_ids, *measured_ids, tail]))
    new_ports = {r["client_port"] for r in window} - seen
    return (
        spent * 1000 / measured,
        f"{len(window) / measured:.2f}",
        f"{len(new_ports) / measured:.2f}",
        ", ".join(f"{n / measured:.2f}" for n in handshakes),
        _median_ms(first_byte[1]) if len(first_byte) > 1 else "n/a",  # the model's proxy
    )


def _median_ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.1f}" if seconds else "n/a"


class _TlsProxy:
    """TLS in front of a plain HTTP server: bytes both ways, each accepted connection counted.

    ``first_byte_s`` holds, per request, the time from its start to the first byte of the
    answer: a request's start is the accept for the first one on a connection (so the TLS
    handshake is in it) and its first byte for the next ones.
    """

    def __init__(self, target: str, context: ssl.SSLContext) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._context = context
        self.accepted = 0
        self.first_byte_s: list[float] = []
        self.url = ""

    async def serve(self, ready: threading.Event, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        async with server:
            await stop.wait()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        waiting = _Waiting(since=time.perf_counter())
        try:
            await writer.start_tls(self._context)
        except (ConnectionError, ssl.SSLError):
            writer.close()
            return
        target_reader, target_writer = await asyncio.open_connection(*self._target)
        await asyncio.gather(
            _pipe(reader, target_writer, waiting.request_bytes),
            _pipe(target_reader, writer, lambda: waiting.answer_bytes(self.first_byte_s)),
        )


class _Waiting:
    """When the request now waiting for its answer started (None: none waits)."""

    def __init__(self, since: float) -> None:
        self.since: float | None = since

    def request_bytes(self) -> None:
        if self.since is None:
            self.since = time.perf_counter()

    def answer_bytes(self, first_byte_s: list[float]) -> None:
        if self.since is not None:
            first_byte_s.append(time.perf_counter() - self.since)
            self.since = None


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_bytes: Callable[[], None]
) -> None:
    try:
        while chunk := await reader.read(65536):
            on_bytes()
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@contextmanager
def tls_proxies(*targets: str) -> Iterator[tuple[_TlsProxy, ...] | Any]:
    """A TLS proxy before each target URL, in a thread, and the CA file that trusts them."""
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as workdir:
        cert, key = Path(workdir) / "cert.pem", Path(workdir) / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        proxies = tuple(_TlsProxy(target, context) for target in targets)
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        ready = [threading.Event() for _ in proxies]

        async def serve_all() -> None:
            await asyncio.gather(*(p.serve(r, stop) for p, r in zip(proxies, ready, strict=True)))

        thread = threading.Thread(target=loop.run_until_complete, args=(serve_all(),))
        thread.start()
        for event in ready:
            event.wait(10)
        try:
            yield (*proxies, cert)
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)


def _mcp_hub_url(config_path: Path) -> str:
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    url = str(config["servers"]["hub"]["url"])
    return url.removesuffix("/mcp")


def _behind(config_path: Path, hub_url: str, beside: Path) -> Path:
    """The stack's MCP_CONFIG with mcp-hub at ``hub_url``, written next to ``beside``."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config["servers"]["hub"]["url"] = hub_url
    path = beside.with_name("mcp-tls.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _model_requests(llm_url: str) -> list[dict[str, Any]]:
    answer = httpx2.get(f"{llm_url}/_scripted/requests", timeout=10.0)
    answer.raise_for_status()
    requests: list[dict[str, Any]] = answer.json()["requests"]
    return requests
