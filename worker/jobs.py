"""The rq job: ``worker.jobs.run_task``, the function producers name in Redis.

A thin adapter over ``worker.pipeline``: it builds the task's runtime from rq's job, runs
the pipeline in a fresh event loop and hands the verdict back to rq (``job.meta``, the
failed registry).
"""

from __future__ import annotations

from typing import Any

import anyio

from worker.coordination import fence_revoked_run
from worker.exceptions import TaskFailed
from worker.pipeline import (
    TaskRuntime,
    TaskVerdict,
    error_post_content,
    execute_task,
    metrics_observer,
    runtime_for_job,
)
from worker.tracing import traced_job


@traced_job  # the run's CONSUMER span, flushed before rq's job process ends with os._exit
def run_task(task: Any) -> dict[str, Any]:
    """rq job function ``worker.jobs.run_task``: the task object in, the AgentReport out.

    Failing outcomes store the report in ``job.meta["report"]`` and raise, so
    operators find them in rq's failed registry (with a redacted message).
    """
    from rq import get_current_job

    job: Any = get_current_job()
    runtime = runtime_for_job(job)
    try:
        verdict = anyio.run(execute_task, task, runtime)
    finally:
        runtime.flush_metrics()
    report = verdict.report.to_wire()
    fence_revoked_run()  # a run its worker handed back leaves the job to the next run
    if job is not None:
        job.meta["report"] = report
        if verdict.requeue is not None:
            job.meta["requeue"] = verdict.requeue
        job.save_meta()
    if verdict.report.outcome.fails_job:
        if job is not None:
            job.retries_left = 0  # a failed task is final: rq must not retry it on its own
        error = verdict.report.error
        detail = f"{error.class_}: {error.message}" if error else "no detail"
        raise TaskFailed(f"task {verdict.report.task_id} {verdict.report.outcome.value}: {detail}")
    return report


__all__ = [
    "TaskRuntime",
    "TaskVerdict",
    "error_post_content",
    "execute_task",
    "metrics_observer",
    "run_task",
]
