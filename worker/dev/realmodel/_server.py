"""llama-server on a free loopback port, for as long as the evaluation runs.

Few threads (the machine is shared), one slot, the fenced chat template, and a
4096-token context. Stopped by its own PID when the block ends.

``REALMODEL_THREADS`` (default 2) sets llama-server's threads. On cores other work keeps
busy, 1 is faster: llama.cpp's threads meet at a spinning barrier many times per token,
and a preempted thread keeps the other spinning until it runs again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from worker.dev.devstack import free_port
from worker.dev.realmodel._setup import ModelSpec, ensure_template, model_path, server_binary

CONTEXT_TOKENS = 4096
CACHE_REUSE_TOKENS = 256
THREADS_ENV = "REALMODEL_THREADS"
_READY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class RunningModel:
    base_url: str  # the OpenAI-compatible root, ending in /v1
    alias: str
    pid: int
    log_path: Path


@contextmanager
def llama_server(
    cache: Path,
    spec: ModelSpec,
    *,
    context_tokens: int = CONTEXT_TOKENS,
    threads: int | None = None,
) -> Iterator[RunningModel]:
    """Start llama-server for ``spec`` and stop it (by PID) when the block ends."""
    if threads is None:
        threads = int(os.environ.get(THREADS_ENV) or 2)
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    argv = [
        str(server_binary(cache)), "-m", str(model_path(cache, spec)),
        "--chat-template-file", str(ensure_template(cache, spec)), "--jinja",
        "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
        "-c", str(context_tokens), "-np", "1", "--alias", spec.alias,
        # Past a part that differs (a task's own line), reuse the slot's cached chunks of at
        # least this many tokens (the tools after it) by shifting them, not computing again.
        "--cache-reuse", str(CACHE_REUSE_TOKENS),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        _wait_ready(port, process, log_path)
        yield RunningModel(
            base_url=f"http://127.0.0.1:{port}/v1",
            alias=spec.alias,
            pid=process.pid,
            log_path=log_path,
        )
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


def _wait_ready(port: int, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llama-server exited at start:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if json.loads(answer.read()).get("status") == "ok":
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama-server did not become ready within {_READY_TIMEOUT_S:g} s")
