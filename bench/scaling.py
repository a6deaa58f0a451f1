"""Throughput of 1, 2, 4 and 8 workers when every model call takes 200 ms.

Separate ``rq worker agents`` processes (stock AgentWorker) run three-step
notification tasks against the scripted endpoint set to 200 ms per call, so one
task cannot take less than 600 ms: the model-bound ideal is N / 0.6 s tasks per
second. All workers have registered before the tasks are enqueued; throughput is
tasks / (last ended_at - first started_at). CPU time of the workers (with their
job processes) and of the stack's servers over the same window says how much
of the machine one task takes.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from bench._procs import cpu_seconds
from bench._report import Summary, Table
from bench._size import Size
from bench._stack import (
    STEPS_PER_TASK,
    BenchStack,
    bench_stack,
    job_times,
    require_completed,
    running_workers,
    stack_pids,
    wait_for_jobs,
)

WORKER_COUNTS = (1, 2, 4, 8)
LLM_LATENCY_S = 0.2
TASKS_PER_WORKER = 8
RUNS = 2
JOB_WAIT_S = 600


@dataclass(frozen=True)
class ScalingRun:
    workers: int
    tasks: int
    tasks_per_s: float
    worker_cpu_s: float
    server_cpu_s: float


def _one_run(bench: BenchStack, workers: int, tasks_per_worker: int) -> ScalingRun:
    servers = stack_pids(bench)
    with running_workers(bench.worker_env(), workers, bench.redis) as pool:
        worker_cpu = sum(cpu_seconds(pid) for pid in pool.pids)
        server_cpu = sum(cpu_seconds(pid) for pid in servers.values())
        tasks = bench.seed(workers * tasks_per_worker)
        ids = [task["task_id"] for task in tasks]
        wait_for_jobs(bench.redis, ids, timeout_s=JOB_WAIT_S)
        worker_cpu = sum(cpu_seconds(pid) for pid in pool.pids) - worker_cpu
        server_cpu = sum(cpu_seconds(pid) for pid in servers.values()) - server_cpu
    times = job_times(bench.redis, ids)
    require_completed(times)
    window_s = max(t.ended_at for t in times) - min(t.started_at for t in times)
    return ScalingRun(
        workers=workers,
        tasks=len(ids),
        tasks_per_s=len(ids) / window_s,
        worker_cpu_s=worker_cpu,
        server_cpu_s=server_cpu,
    )


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    runs_per_count = size.pick(full=RUNS, quick=1, smoke=1)
    per_worker = size.pick(full=TASKS_PER_WORKER, quick=4, smoke=1)
    counts = size.pick(full=WORKER_COUNTS, quick=WORKER_COUNTS, smoke=WORKER_COUNTS[:2])
    results: dict[int, list[ScalingRun]] = {count: [] for count in counts}
    started = time.monotonic()
    with bench_stack(llm_latency_s=LLM_LATENCY_S) as bench:
        # Every worker's first tasks in a fresh stack pay one-off costs: warm the stack up.
        _one_run(bench, 1, 2)
        for _ in range(runs_per_count):
            for count in counts:
                results[count].append(_one_run(bench, count, per_worker))
    one_worker = statistics.median(r.tasks_per_s for r in results[1])
    table = Table(
        f"scaling: N workers, scripted model at {LLM_LATENCY_S * 1000:.0f} ms per call, "
        f"{STEPS_PER_TASK}-step tasks",
        [
            "workers",
            "runs x tasks",
            "tasks/s median",
            "min-max",
            "ideal",
            "of ideal",
            "of N x 1 worker",
            "CPU ms/task worker+jobs",
            "CPU ms/task servers",
        ],
    )
    for count, runs in results.items():
        rate = Summary.of([r.tasks_per_s for r in runs])
        ideal = count / (STEPS_PER_TASK * LLM_LATENCY_S)
        tasks = sum(r.tasks for r in runs)
        table.add(
            count,
            f"{len(runs)} x {runs[0].tasks}",
            *rate.cells(2),
            f"{ideal:.2f}",
            f"{rate.median / ideal * 100:.0f}%",
            f"{rate.median / (count * one_worker) * 100:.0f}%",
            f"{sum(r.worker_cpu_s for r in runs) / tasks * 1000:.0f}",
            f"{sum(r.server_cpu_s for r in runs) / tasks * 1000:.0f}",
        )
    table.notes = [
        f"ideal: N / ({STEPS_PER_TASK} x {LLM_LATENCY_S} s), the model-bound rate. targets: one "
        "worker >= 85% of ideal; N workers >= 90% of N x one worker.",
        "servers: devhub, mcp-hub, mcp-web, scripted endpoint and redis-server, all on this "
        f"machine ({os.cpu_count()} cores) next to the workers.",
        f"wall time of this benchmark: {time.monotonic() - started:.0f} s.",
    ]
    return [table]
