"""What the conformance tests do to a worker, only through rq's own API and real processes."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rq import Queue, Retry
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from tests.chaos.harness import AGENT, ChaosStack, WorkerProcess, unique
from tests.support.jobs import RUNS_KEY
from tests.support.workers import WORKER_CLASS, wait_until
from worker.enqueue import DEFAULT_QUEUE

# Small enough for a test to watch a job run past its timeout (the setting's minimum).
TIMEOUT_GRACE_S = 5


def start_test_worker(stack: ChaosStack, *args: str, **env: str) -> WorkerProcess:
    """``rq worker agents`` that may also run the job functions of tests.support.jobs."""
    env = {"RQ_WORKER_CLASS": WORKER_CLASS, "JOB_TIMEOUT_GRACE_S": str(TIMEOUT_GRACE_S), **env}
    return stack.start_worker("--job-monitoring-interval", "1", *args, **env)


def enqueue_job(
    stack: ChaosStack,
    function: str,
    *,
    max_duration_s: int = 60,
    retries: int = 0,
    meta: dict[str, Any] | None = None,
) -> str:
    """Enqueue ``tests.support.jobs.<function>`` with rq's API, its argument an agent task
    whose ``max_duration_s`` sets rq's timeout (plus the grace)."""
    job_id = unique(function)
    task = {
        "task_id": job_id,
        "type": "exploration",
        "agent_id": AGENT,
        "constraints": {"max_duration_s": max_duration_s},
    }
    with contextlib.closing(stack.connection()) as connection:
        queue = Queue(DEFAULT_QUEUE, connection=connection, serializer=JSONSerializer)
        queue.enqueue(
            f"tests.support.jobs.{function}",
            task,
            job_id=job_id,
            retry=Retry(max=retries) if retries else None,
            meta=meta or {},
        )
    return job_id


def run_one_job(
    stack: ChaosStack, function: str, *args: str, **enqueue: Any
) -> tuple[WorkerProcess, str]:
    """A test worker, and one job of ``function`` it has started running."""
    worker = start_test_worker(stack, *args)
    job_id = enqueue_job(stack, function, **enqueue)
    wait_for_runs(stack, job_id, 1)
    return worker, job_id


def wait_for_runs(stack: ChaosStack, job_id: str, count: int) -> None:
    wait_until(lambda: runs_of(stack, job_id) >= count, 60, f"job {job_id} to run {count} time(s)")


def runs_of(stack: ChaosStack, job_id: str) -> int:
    with contextlib.closing(stack.connection()) as connection:
        return int(connection.hget(RUNS_KEY, job_id) or 0)


def started_scores(stack: ChaosStack) -> dict[str, float]:
    """rq's started registry: each execution and when it expires (its score)."""
    with contextlib.closing(stack.connection()) as connection:
        key = StartedJobRegistry(DEFAULT_QUEUE, connection=connection).key
        return {m.decode(): s for m, s in connection.zrange(key, 0, -1, withscores=True)}


def expired_started_entries(stack: ChaosStack) -> list[str]:
    """Executions the started registry holds as already expired (a heartbeat in the past)."""
    now = time.time()
    return [member for member, score in started_scores(stack).items() if score < now - 1]
