"""A private, throwaway redis-server on a free port (never the machine's 6379)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from worker.devstack import free_port, redis_server_command

__all__ = ["RedisServer", "free_port", "running_redis"]


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
    return subprocess.Popen(
        redis_server_command(port, workdir, appendonly=appendonly),
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
