"""How long the neighbours of a task that crashes the process take to come back.

A concurrent worker (``WORKER_CONCURRENCY``) runs its tasks in one process: a crash of
native code in one of them (a segfault, an abort, the OOM killer) ends every task in
flight. They come back only through rq's abandoned-job recovery: once each execution's
heartbeat expired (rq's job monitoring interval plus 60 s after the last one) and a
worker ran its maintenance. For each setting below, one ``rq worker agents`` with
``WORKER_CONCURRENCY=4`` runs three agent tasks (three model calls of 2 s each); a fourth
job aborts the process; a new worker starts at once (a supervisor's restart delay, 5 s
with the systemd unit, comes on top) and the table shows when the three were running
again and when they had finished, counted from the crash.
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
from bench._size import Size
from bench._stack import BENCH_AGENT, REPO_ROOT, RQ, BenchStack, bench_stack, wait_for_jobs
from worker import AgentWorker

NEIGHBOURS = 3
LLM_LATENCY_S = 2.0
# (label, rq's --job-monitoring-interval, --maintenance-interval); None: the worker's default.
SETTINGS = (
    ("defaults (30 s heartbeats, 60 s maintenance)", None, None),
    ("--job-monitoring-interval 5 --maintenance-interval 5", 5, 5),
)


def crash_in_native_code(task: dict[str, Any]) -> None:
    """The job that takes the process down, as a segfaulting extension would."""
    os.abort()


class CrashRecoveryWorker(AgentWorker):
    """AgentWorker that may also run ``crash_in_native_code``."""

    allowed_functions: ClassVar[frozenset[str]] = AgentWorker.allowed_functions | {
        f"{__name__}.crash_in_native_code"
    }


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    settings = size.pick(full=SETTINGS, quick=SETTINGS[1:], smoke=SETTINGS[1:])
    table = Table(
        "crash recovery: a native crash in one task of a concurrent worker, s after the crash",
        ["setting", "neighbours", "running again", "all finished"],
        notes=[
            "a new worker starts at once; add the supervisor's restart delay",
            "in a forking worker only the crashing job's process dies",
        ],
    )
    with bench_stack(llm_latency_s=LLM_LATENCY_S) as bench:
        for label, heartbeat_s, maintenance_s in settings:
            args = []
            if heartbeat_s is not None:
                args += ["--job-monitoring-interval", str(heartbeat_s)]
            if maintenance_s is not None:
                args += ["--maintenance-interval", str(maintenance_s)]
            running_again, finished = _measure(bench, args)
            table.add(label, NEIGHBOURS, f"{running_again:.0f}", f"{finished:.0f}")
    return [table]


def _measure(bench: BenchStack, args: list[str]) -> tuple[float, float]:
    bench.redis.flushall()
    env = bench.worker_env(
        RQ_WORKER_CLASS=f"{__name__}.CrashRecoveryWorker", WORKER_CONCURRENCY="4"
    )
    tasks = bench.seed(NEIGHBOURS)
    ids = [task["task_id"] for task in tasks]
    started = StartedJobRegistry("agents", connection=bench.redis)
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as logdir:
        first = _start(env, args, Path(logdir) / "first.log")
        replacement = None
        try:
            _wait(lambda: len(started.get_job_ids(cleanup=False)) == NEIGHBOURS, "in flight")
            queue = Queue("agents", connection=bench.redis, serializer=JSONSerializer)
            crash_task = {"task_id": "crash", "type": "exploration", "agent_id": BENCH_AGENT}
            queue.enqueue(f"{__name__}.crash_in_native_code", crash_task, job_id="crash")
            first.wait(timeout=120)
            crashed_at = time.monotonic()
            replacement = _start(env, args, Path(logdir) / "replacement.log")
            crashed_runs = _started_runs(bench, started.key)
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
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [RQ, "worker", "agents", *args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def _started_runs(bench: BenchStack, key: str) -> set[bytes]:
    """A started registry's members, ``<job id>:<execution id>`` (the client answers bytes)."""
    return {member for member in bench.redis.zrange(key, 0, -1) if isinstance(member, bytes)}


def _all_rerun(bench: BenchStack, job_ids: list[str], crashed_runs: set[bytes]) -> bool:
    """Every neighbour runs again (an execution the crash did not end), or has ended."""
    started = StartedJobRegistry("agents", connection=bench.redis)
    running = {
        member.decode().partition(":")[0]
        for member in _started_runs(bench, started.key) - crashed_runs
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
