"""Job functions for real ``rq worker`` subprocesses in tests (allowed by TestAgentWorker).

Each records its runs in Redis (``RUNS_KEY`` counts per job id, ``ORDER_KEY``
lists job ids in the order they ran) so tests can see what ran, how often and
in which order, from outside the worker.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from rq import get_current_job
from rq.job import Job

from worker.daemon import register_child_process
from worker.exceptions import InvalidTask
from worker.metrics import JobMetrics

RUNS_KEY = "agent-worker-test:runs"
ORDER_KEY = "agent-worker-test:order"


def _record_run() -> Job:
    job = get_current_job()
    assert job is not None, "test jobs only run inside an rq worker"
    with job.connection.pipeline() as pipe:
        pipe.hincrby(RUNS_KEY, job.id, 1)
        pipe.rpush(ORDER_KEY, job.id)
        pipe.execute()
    return job


def echo_task(task: dict[str, Any]) -> dict[str, Any]:
    """Return the task it got and the rq timeout it ran under."""
    job = _record_run()
    return {"task": task, "timeout": job.timeout}


def fail_as_invalid(task: dict[str, Any]) -> None:
    """Fail the way run_task fails an invalid task: report in meta, then raise."""
    job = _record_run()
    job.meta["report"] = {"task_id": job.id, "outcome": "invalid_task"}
    job.save_meta()  # type: ignore[no-untyped-call]
    raise InvalidTask("invalid task: agent_id: unknown agent")


def fail(task: Any) -> None:
    """Fail with an ordinary error (retried when the job has retries left)."""
    _record_run()
    raise RuntimeError("this job always fails")


def write_marker(path: str) -> None:
    """Never allowed: proves a refused job was not executed."""
    Path(path).write_text("executed", encoding="utf-8")


def record_metrics(task: dict[str, Any]) -> None:
    """Record one of every job-side metric and flush them for the worker parent."""
    job = _record_run()
    metrics = JobMetrics()
    metrics.llm_call(
        provider="anthropic",
        model="claude-test",
        status="ok",
        tokens_input=120,
        tokens_output=30,
    )
    metrics.tool_call(server="hub", tool="search_posts", outcome="ok", duration_s=0.2)
    metrics.grant_denied(agent=task["agent_id"], tool="hub__create_post")
    metrics.error_posted()
    metrics.task_finished(
        agent=task["agent_id"],
        task_type=task["type"],
        outcome="completed",
        duration_s=1.5,
        iterations=2,
        cost_usd=0.01,
    )
    metrics.flush(job.connection, job.id)


def spawn_child(task: dict[str, Any]) -> int:
    """Leave a process group behind, as a stdio MCP server in its own session would."""
    job = _record_run()
    child = subprocess.Popen(
        ["sleep", "300"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    register_child_process(job.connection, job.id, child.pid)
    return child.pid


def ask_requeue(task: dict[str, Any]) -> dict[str, str]:
    """Finish, asking the worker to run the same task again in 30 s (attempt 2)."""
    job = _record_run()
    job.meta["requeue"] = {"delay_s": 30, "attempt": 2}
    job.save_meta()  # type: ignore[no-untyped-call]
    return {"outcome": "requeued"}
