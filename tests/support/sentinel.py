"""A private Sentinel-managed Redis: a primary, one replica and three sentinels on free ports.

Short ``down-after-milliseconds`` and ``failover-timeout`` make a failover take
seconds. ``running_sentinel_redis()`` returns only once the replica is in sync
and every sentinel knows the replica and the other two sentinels, so a test
that kills the primary right away still sees a failover.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.redis_server import RedisProcess, spawn_redis
from worker.dev.devstack import free_port, redis_server_command

__all__ = ["MASTER_NAME", "SentinelRedis", "running_sentinel_redis"]

MASTER_NAME = "fleet"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000
READY_TIMEOUT_S = 30.0


@dataclass
class SentinelRedis:
    primary: RedisProcess
    replica: RedisProcess
    sentinels: list[RedisProcess] = field(default_factory=list)
    workdir: Path = field(default_factory=Path)

    @property
    def sentinel_addresses(self) -> str:
        """The ``REDIS_SENTINELS`` value for this setup."""
        return ",".join(f"127.0.0.1:{node.port}" for node in self.sentinels)

    def primary_port_seen_by_sentinels(self) -> set[int]:
        """The primary port each answering sentinel names now."""
        ports = set()
        for node in self.sentinels:
            host_port = node.ask(lambda c: c.sentinel_get_master_addr_by_name(MASTER_NAME))
            if host_port:
                ports.add(int(host_port[1]))
        return ports

    def wait_for_failover(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every sentinel names the replica as the primary and it accepts writes."""

        def replica_promoted() -> bool:
            if self.primary_port_seen_by_sentinels() != {self.replica.port}:
                return False
            role = self.replica.ask(lambda c: c.execute_command("ROLE"))
            return bool(role) and role[0] in (b"master", "master")

        _wait(replica_promoted, timeout_s, "the sentinels to promote the replica")

    def sentinel_logs(self) -> str:
        """What the sentinels logged (their view of the failover), for a failing test's message."""
        logs = []
        for node in self.sentinels:
            path = self.workdir / f"sentinel-{node.port}.log"
            if path.exists():
                logs.append(f"--- sentinel {node.port}\n{path.read_text(errors='replace')}")
        return "\n".join(logs)

    def stop(self) -> None:
        for node in [*self.sentinels, self.replica, self.primary]:
            node.stop()


def _start_data_node(workdir: Path, *, replica_of: int | None = None) -> RedisProcess:
    port = free_port()
    directory = workdir / f"redis-{port}"
    directory.mkdir()
    argv = redis_server_command(port, str(directory))
    if replica_of is not None:
        argv += ["--replicaof", "127.0.0.1", str(replica_of)]
    return RedisProcess(port, spawn_redis(argv))


def _start_sentinel(workdir: Path, primary_port: int) -> RedisProcess:
    port = free_port()
    # A sentinel rewrites its own config file (what it learnt): it must be a writable file.
    config = workdir / f"sentinel-{port}.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {workdir}\nlogfile {workdir}/sentinel-{port}.log\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} {QUORUM}\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n"
    )
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is required"
    return RedisProcess(port, spawn_redis([binary, str(config), "--sentinel"]))


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _replica_in_sync(setup: SentinelRedis) -> bool:
    info = setup.primary.ask(lambda c: c.info("replication"))
    replica = (info or {}).get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


def _sentinels_agree(setup: SentinelRedis) -> bool:
    """Each sentinel monitors the primary and knows the replica and the two other sentinels."""
    for node in setup.sentinels:
        master = node.ask(lambda c: c.sentinel_master(MASTER_NAME))
        if not master or int(master.get("port", 0)) != setup.primary.port:
            return False
        if master.get("num-other-sentinels") != SENTINELS - 1 or master.get("num-slaves") != 1:
            return False
    return True


@contextlib.contextmanager
def running_sentinel_redis() -> Iterator[SentinelRedis]:
    """Primary, replica and three sentinels, ready for a failover; all stopped on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="test-sentinel-"))
    primary = _start_data_node(workdir)
    replica = _start_data_node(workdir, replica_of=primary.port)
    setup = SentinelRedis(primary=primary, replica=replica, workdir=workdir)
    try:
        setup.sentinels = [_start_sentinel(workdir, primary.port) for _ in range(SENTINELS)]
        _wait(lambda: _replica_in_sync(setup), READY_TIMEOUT_S, "the replica to sync")
        _wait(lambda: _sentinels_agree(setup), READY_TIMEOUT_S, "the sentinels to agree")
        yield setup
    finally:
        setup.stop()
        shutil.rmtree(workdir, ignore_errors=True)
