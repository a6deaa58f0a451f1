"""A private, throwaway redis-server on a free port (never the machine's 6379)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from tests.support import SERVER_READY_TIMEOUT_S
from worker.dev.devstack import free_port, redis_server_command

__all__ = ["RedisProcess", "RedisServer", "free_port", "running_redis", "spawn_redis"]


@dataclass
class RedisProcess:
    """A redis-server (or sentinel) process of a test, on its own port."""

    port: int
    process: subprocess.Popen[bytes]

    def ask(self, command: Callable[[redis.Redis], Any]) -> Any:
        """One command on a short-lived connection; None when the process does not answer."""
        with redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2) as client:
            try:
                return command(client)
            except redis.RedisError:
                return None

    def kill(self) -> None:
        """SIGKILL: the process vanishes as a crashed host would, nothing flushed or handed over."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class RedisServer(RedisProcess):
    workdir: str
    # Keep an append-only file in workdir, so data survives start_again() (restart scenarios).
    appendonly: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start_again(self) -> None:
        """Restart on the same port (for Redis-restart scenarios)."""
        self.stop()
        self.process = spawn_redis(
            redis_server_command(self.port, self.workdir, appendonly=self.appendonly)
        )
        _wait_ready(self.port)


def spawn_redis(argv: list[str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` (a ``redis_server_command``, or a sentinel's), its output discarded."""
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(port: int, timeout_s: float = SERVER_READY_TIMEOUT_S) -> None:
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
        process=spawn_redis(redis_server_command(port, workdir, appendonly=appendonly)),
        workdir=workdir,
        appendonly=appendonly,
    )
    try:
        _wait_ready(port)
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
