"""How long the neighbours of a task that crashes the process take to come back.

A concurrent worker (``WORKER_CONCURRENCY``) runs its tasks in one process: a crash of
native code in one of them (a segfault, an abort, the OOM killer) ends every task in
flight. They come back only through rq's abandoned-job recovery: once each execution's
heartbeat expired (rq's job monitoring interval plus 60 s after the last one) and a
worker ran its maintenance. For each setting below, one ``rq worker agents`` with
``WORKER_CONCURRENCY=4`` runs three agent tasks (three model calls of 2 s each); a fourth
job aborts the process; a new worker starts at once (a supervisor's restart delay, 5 s
with the systemd unit, comes on top) and the table shows when the three were running
again and when they had finished, counted from the crash. The last row is
``agent-worker pool --processes 1 --concurrency 4``: the pool sees its worker die, hands
its jobs back through rq at once and forks a new worker.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from rq import Queue
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from bench._report import Table
from bench._stack import (
    AGENT_WORKER,
    BENCH_AGENT,
    REPO_ROOT,
    RQ,
    BenchStack,
    bench_stack,
    wait_for_jobs,
)
from worker import AgentWorker

NEIGHBOURS = 3
LLM_LATENCY_S = 2.0
# (label, command after the program, rq's --job-monitoring-interval and --maintenance-interval
# where set); the program is rq's for "worker", agent-worker's for "pool".
SETTINGS: tuple[tuple[str, list[str]], ...] = (
    ("rq worker, defaults (30 s heartbeats, 60 s maintenance)", ["worker", "agents"]),
    (
        "rq worker --job-monitoring-interval 5 --maintenance-interval 5",
        ["worker", "agents", "--job-monitoring-interval", "5", "--maintenance-interval", "5"],
    ),
    ("agent-worker pool --processes 1 --concurrency 4", ["pool", "--processes", "1"]),
)


def crash_in_native_code(task: dict[str, Any]) -> None:
    """The job that takes the process down, as a segfaulting extension would."""
    os.abort()


class CrashRecoveryWorker(AgentWorker):
    """AgentWorker that may also run ``crash_in_native_code``."""

    allowed_functions: ClassVar[frozenset[str]] = AgentWorker.allowed_functions | {
        f"{__name__}.crash_in_native_code"
    }


def benchmark(*, quick: bool = False) -> list[Table]:
    settings = SETTINGS[1:] if quick else SETTINGS
    table = Table(
        "crash recovery: a native crash in one task of a concurrent worker, s after the crash",
        ["setting", "neighbours", "running again", "all finished"],
        notes=[
            "a new worker starts at once; add the supervisor's restart delay",
            "in a forking worker only the crashing job's process dies",
        ],
    )
    with bench_stack(llm_latency_s=LLM_LATENCY_S) as bench:
        for label, args in settings:
            running_again, finished = _measure(bench, args)
            table.add(label, NEIGHBOURS, f"{running_again:.1f}", f"{finished:.1f}")
    return [table]


def _measure(bench: BenchStack, args: list[str]) -> tuple[float, float]:
    bench.redis.flushall()
    env = bench.worker_env(
        RQ_WORKER_CLASS=f"{__name__}.CrashRecoveryWorker",
        WORKER_CONCURRENCY="4",
        POOL_CONCURRENCY="4",
    )
    tasks = bench.seed(NEIGHBOURS)
    ids = [task["task_id"] for task in tasks]
    started = StartedJobRegistry("agents", connection=bench.redis)
    pool = args[0] == "pool"
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as logdir:
        first = _start(env, args, Path(logdir) / "first.log")
        replacement = None
        try:
            _wait(lambda: len(started.get_job_ids(cleanup=False)) == NEIGHBOURS, "in flight")
            crashed_runs = set(bench.redis.zrange(started.key, 0, -1))
            running_in = _worker_pids(bench)
            queue = Queue("agents", connection=bench.redis, serializer=JSONSerializer)
            crash_task = {"task_id": "crash", "type": "exploration", "agent_id": BENCH_AGENT}
            queue.enqueue(f"{__name__}.crash_in_native_code", crash_task, job_id="crash")
            if pool:  # the pool stays; its worker dies and a new one replaces it
                _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in running_in), "crash")
            else:
                first.wait(timeout=120)
            crashed_at = time.monotonic()
            if not pool:
                replacement = _start(env, args, Path(logdir) / "replacement.log")
            _wait(lambda: _all_rerun(bench, ids, crashed_runs), "re-runs", timeout_s=600)
            running_again = time.monotonic() - crashed_at
            wait_for_jobs(bench.redis, ids, timeout_s=300)
            return running_again, time.monotonic() - crashed_at
        finally:
            for process in (first, replacement):
                if process is not None and process.poll() is None:
                    process.terminate()
                    process.wait(timeout=120)


def _start(env: dict[str, str], args: list[str], log: Path) -> subprocess.Popen[bytes]:
    program = AGENT_WORKER if args[0] == "pool" else RQ
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [program, *args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def _worker_pids(bench: BenchStack) -> list[int]:
    """The pids of the rq workers registered now (rq's worker registry)."""
    pids = []
    for key in bench.redis.smembers("rq:workers"):
        pid = bench.redis.hget(key, "pid")
        if pid is not None:
            pids.append(int(pid))
    return pids


def _all_rerun(bench: BenchStack, job_ids: list[str], crashed_runs: set[bytes]) -> bool:
    """Every neighbour runs again (an execution the crash did not end), or has ended."""
    started = StartedJobRegistry("agents", connection=bench.redis)
    running = {
        member.decode().partition(":")[0]
        for member in set(bench.redis.zrange(started.key, 0, -1)) - crashed_runs
    }
    for job_id in job_ids:
        status = bench.redis.hget(f"rq:job:{job_id}", "status")
        if status not in (b"finished", b"failed") and job_id not in running:
            return False
    return True


def _wait(condition: Any, what: str, *, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"crash recovery: timed out waiting for {what}")
        time.sleep(0.2)
