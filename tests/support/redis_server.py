"""A private, throwaway redis-server on a free port (never the machine's 6379)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    workdir: str
    # Keep an append-only file in workdir, so data survives start_again() (restart scenarios).
    appendonly: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def start_again(self) -> None:
        """Restart on the same port (for Redis-restart scenarios)."""
        self.stop()
        self.process = _spawn(self.port, self.workdir, appendonly=self.appendonly)
        _wait_ready(self.port)


def _spawn(port: int, workdir: str, *, appendonly: bool = False) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server)"
        )
    return subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if appendonly else "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_ready(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    client = redis.Redis(port=port)
    while True:
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def running_redis(*, appendonly: bool = False) -> Iterator[RedisServer]:
    """A redis-server on a free port; ``appendonly`` keeps its data across ``start_again()``."""
    workdir = tempfile.mkdtemp(prefix="test-redis-")
    port = free_port()
    server = RedisServer(
        port=port,
        process=_spawn(port, workdir, appendonly=appendonly),
        workdir=workdir,
        appendonly=appendonly,
    )
    try:
        _wait_ready(port)
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
