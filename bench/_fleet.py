"""Starting and stopping the workers of one in-flight row, and forgetting what they left.

A mechanism is a way of keeping N tasks in flight on one machine: rq's pool of
forking workers, or P concurrent workers of N/P tasks each.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench._procs import process_tree
from bench._stack import AGENT_WORKER, REPO_ROOT, RQ, BenchStack, has_concurrent_worker
from worker.redis_io import keys as redis_keys

QUEUE = "agents"
STOP_TIMEOUT_S = 60.0
# A subset of mechanisms by kind, comma-separated (default: every one this code has).
KINDS = os.environ.get(
    "BENCH_IN_FLIGHT_KINDS", "pool,preloaded-pool,concurrent,pool-concurrent,agent-worker-pool"
).split(",")


@dataclass(frozen=True)
class Mechanism:
    """One way of keeping N tasks in flight: the commands it starts for a target N.

    ``launcher`` is "rq worker" (separate processes), "pool" (``rq worker-pool``),
    "preloaded-pool" (``bench._preloaded_pool``) or "agent-worker pool" (the product's
    supervised pool of concurrent workers); ``processes`` None means one
    forking worker per task in flight, a number that many concurrent workers of
    N/processes tasks each. ``kind`` names it for ``BENCH_IN_FLIGHT_KINDS``.
    """

    label: str
    kind: str
    launcher: str
    processes: int | None = None

    def commands(self, target: int, redis_url: str) -> list[tuple[list[str], dict[str, str]]]:
        workers = self.registered_workers(target)
        env = {}
        if self.processes is not None:
            env["WORKER_CONCURRENCY"] = str(math.ceil(target / self.processes))
        if self.launcher == "rq worker":
            return [([RQ, "worker", QUEUE], env) for _ in range(workers)]
        if self.launcher == "agent-worker pool":
            # The pool's workers are concurrent ones (at least 2 slots each): at the smoke
            # size's target of 2, a worker has a slot to spare.
            per_worker = str(max(2, math.ceil(target / workers)))
            argv = [AGENT_WORKER, "pool", "--processes", str(workers), "--concurrency", per_worker]
            return [(argv, {})]
        pool = [RQ, "worker-pool"]
        if self.launcher == "preloaded-pool":
            pool = [sys.executable, "-m", "bench._preloaded_pool"]
        argv = [*pool, QUEUE, "-n", str(workers), "-w", "worker.AgentWorker", "-u", redis_url]
        return [(argv, env)]

    def registered_workers(self, target: int) -> int:
        return target if self.processes is None else self.processes


def mechanisms() -> list[Mechanism]:
    """The pools always; the concurrent worker only where this code has the setting."""
    found = [
        Mechanism("rq worker-pool -n N (fork per job)", "pool", "pool"),
        Mechanism("same, preloaded parent", "preloaded-pool", "preloaded-pool"),
    ]
    if has_concurrent_worker():
        found += [
            Mechanism("1 x rq worker, WORKER_CONCURRENCY=N", "concurrent", "rq worker", 1),
            Mechanism("2 x rq worker, WORKER_CONCURRENCY=N/2", "concurrent", "rq worker", 2),
            Mechanism(
                "preloaded pool -n 2, CONCURRENCY=N/2", "pool-concurrent", "preloaded-pool", 2
            ),
            Mechanism(
                "agent-worker pool --processes 2 --concurrency N/2",
                "agent-worker-pool",
                "agent-worker pool",
                2,
            ),
        ]
    return [mechanism for mechanism in found if mechanism.kind in KINDS]


def start_fleet(
    bench: BenchStack, mechanism: Mechanism, target: int, logdir: Path
) -> list[subprocess.Popen[bytes]]:
    processes = []
    for index, (argv, extra) in enumerate(mechanism.commands(target, bench.stack.redis_url)):
        with open(logdir / f"worker-{index}.log", "wb") as log:
            processes.append(
                subprocess.Popen(
                    argv,
                    cwd=REPO_ROOT,
                    env=bench.worker_env(**extra),
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
    return processes


def stop_fleet(bench: BenchStack, processes: list[subprocess.Popen[bytes]]) -> None:
    """Drop what is still queued, stop warm (running tasks finish), kill what is left."""
    bench.redis.delete(f"rq:queue:{QUEUE}")
    roots = [process.pid for process in processes]
    for pid in roots:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.5)
    for pid in process_tree(roots):
        _signal(pid, signal.SIGKILL)
    for process in processes:
        process.wait()


def forget_runs(bench: BenchStack) -> None:
    """Delete rq's jobs, registries and workers, and the agent's running slots and leases.

    A killed task leaves them behind, and the next row counts in-flight tasks
    and ended jobs from a clean slate.
    """
    patterns = ("rq:*", f"{redis_keys.PREFIX}agent-running:*", f"{redis_keys.PREFIX}lease:*")
    for pattern in patterns:
        keys = list(bench.redis.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 500):
            bench.redis.delete(*keys[start : start + 500])


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
