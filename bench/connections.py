"""What a concurrent worker's task costs in connections and CPU (docs/connections.md).

Real redis-server, the devhub, the MCP servers and the scripted model endpoint; one
``rq worker`` with WORKER_CONCURRENCY=4 runs three-step notifications. After warm-up
tasks, the table shows per measured task: the worker's CPU, the model requests, and
the new connections the model endpoint saw (distinct client ports of those requests).
Run it on two checkouts to put one code's figures beside another's.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2

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
        ["tasks", "CPU ms per task", "model requests per task", "new model connections per task"],
    )
    with bench_stack() as bench:
        assert bench.stack.llm_base_url is not None
        llm_url = bench.stack.llm_base_url
        warm_ids = [task["task_id"] for task in bench.seed(warm_up)]
        measured_ids = [task["task_id"] for task in bench.seed(measured)]
        (tail,) = [task["task_id"] for task in bench.seed(1)]
        env = bench.worker_env(WORKER_CONCURRENCY=CONCURRENCY)
        with running_workers(env, 1, bench.redis) as pool:
            (pid,) = pool.pids
            wait_for_jobs(bench.redis, warm_ids, timeout_s=WORKER_RUN_TIMEOUT_S)
            before = cpu_seconds(pid)
            seen = {r["client_port"] for r in _model_requests(llm_url)}
            count = len(_model_requests(llm_url))
            wait_for_jobs(bench.redis, measured_ids, timeout_s=WORKER_RUN_TIMEOUT_S)
            while bench.redis.hget(f"rq:job:{tail}", "status") in (None, b"queued"):
                time.sleep(0.01)
            spent = cpu_seconds(pid) - before
            window = _model_requests(llm_url)[count:]
            wait_for_jobs(bench.redis, [tail], timeout_s=WORKER_RUN_TIMEOUT_S)
        require_completed(job_times(bench.redis, [*warm_ids, *measured_ids, tail]))
    new_ports = {r["client_port"] for r in window} - seen
    table.add(
        measured,
        f"{spent * 1000 / measured:.1f}",
        f"{len(window) / measured:.2f}",
        f"{len(new_ports) / measured:.2f}",
    )
    table.notes = [
        "CPU: user + system of the worker (/proc), from the end of the warm-up tasks to",
        "  the end of the measured ones. New connections: client ports the model endpoint",
        "  had not seen before the window (the window's requests may include the tail task's).",
    ]
    return [table]


def _model_requests(llm_url: str) -> list[dict[str, Any]]:
    answer = httpx2.get(f"{llm_url}/_scripted/requests", timeout=10.0)
    answer.raise_for_status()
    requests: list[dict[str, Any]] = answer.json()["requests"]
    return requests
