"""Job functions for real ``rq worker`` subprocesses in tests (allowed by TestAgentWorker).

Each records its runs in Redis (``RUNS_KEY`` counts per job id, ``ORDER_KEY``
lists job ids in the order they ran) so tests can see what ran, how often and
in which order, from outside the worker.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis import Redis
from rq import get_current_job
from rq.job import Job

from worker.enqueue import _enqueue_call
from worker.exceptions import InvalidTask
from worker.metrics import JobMetrics
from worker.redis_io import child_process_recorder
from worker.redis_io._children import register_child_process
from worker.task import parse_task

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


SHARED_RUNS_KEY = "agent-worker-test:shared-runs"
SHARED_CHILDREN_KEY = "agent-worker-test:shared-children"
SHARED_VERDICT_KEY = "agent-worker-test:shared-verdict"


def share_id_with_another_run(task: dict[str, Any]) -> int:
    """Two runs of one job id at once, as rq's immediate retry can start them: each leaves
    a child process behind. The first ends once the second has its child; the second waits
    for the first run's clean-up, then records whether its own child survived it."""
    job = _record_run()
    redis = job.connection
    run = redis.incr(SHARED_RUNS_KEY)
    child = subprocess.Popen(
        ["sleep", "300"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    register_child_process(redis, job.id, child.pid)
    redis.rpush(SHARED_CHILDREN_KEY, child.pid)
    if run == 1:
        _wait_for(lambda: redis.llen(SHARED_CHILDREN_KEY) >= 2, "the second run's child")
        return child.pid
    first_child = int(redis.lindex(SHARED_CHILDREN_KEY, 0))
    _wait_for(lambda: not process_running(first_child), "the first run's clean-up")
    redis.set(SHARED_VERDICT_KEY, "alive" if process_running(child.pid) else "killed")
    return child.pid


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.05)


def process_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def assert_gone(pid: int, timeout_s: float = 5.0) -> None:
    """``pid`` stops running within ``timeout_s``, its reaper given a moment after a kill."""
    deadline = time.monotonic() + timeout_s
    while process_running(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} is still running")
        time.sleep(0.05)


def ask_requeue(task: dict[str, Any]) -> dict[str, str]:
    """Finish, asking the worker to run the same task again in 30 s (attempt 2)."""
    job = _record_run()
    job.meta["requeue"] = {"delay_s": 30, "attempt": 2}
    job.save_meta()  # type: ignore[no-untyped-call]
    return {"outcome": "requeued"}


def use_pooled_server(task: dict[str, Any]) -> int:
    """Start a pooled stdio server through a task's toolbox and return its pid, leaving it
    running: as a task in a forked job process (WORKER_CONCURRENCY = 1) leaves it."""
    import anyio

    from tests.support.mcp_test_servers.launch import stdio_entry
    from worker.tools import CallContext, EffectiveGrants, McpConfig, McpToolbox

    job = _record_run()
    entry = stdio_entry("toolkit", {"*": "kit:read"}, pool=True)
    config = McpConfig.model_validate({"servers": {"kit": entry}})

    async def server_pid() -> int:
        async with McpToolbox.open(
            config,
            grants=EffectiveGrants.of(["kit:read"]),
            on_spawn=child_process_recorder(job.connection, job.id),
        ) as toolbox:
            ctx = CallContext(
                task_id=job.id, agent_id="devops-agent", step=1, index=0, timeout_s=30
            )
            return int((await toolbox.call("kit__pid", {}, ctx)).content)

    return anyio.run(server_pid)


def enqueue_test_job(connection: Redis, task_id: str, function_name: str) -> None:
    """Queue one of these job functions on ``agents`` as the product queues a task."""
    raw = {"task_id": task_id, "type": "notification", "agent_id": "devops-agent", "post_id": "p"}
    _enqueue_call(
        connection,
        parse_task(raw),
        function_name=function_name,
        queue_name="agents",
        result_ttl_s=3600,
        timeout_grace_s=60,
        delay_s=0,
        attempt=0,
    )


def spin(task: dict[str, Any]) -> None:
    """Run Python code until rq's timeout ends the job (its exception lands between sleeps)."""
    _record_run()
    while True:
        time.sleep(0.1)


def block_in_native_code(task: dict[str, Any]) -> None:
    """Block in C for five minutes: rq's timer exception cannot reach a thread stuck here."""
    _record_run()
    ctypes.CDLL(None).sleep(300)


def crash_in_native_code(task: dict[str, Any]) -> None:
    """Abort the process from C, as a segfaulting extension or a failed assertion would."""
    _record_run()
    os.abort()


def pause(task: dict[str, Any]) -> dict[str, Any]:
    """Sleep ``PAUSE_S`` seconds of the job's meta (default 5), then return the task."""
    job = _record_run()
    time.sleep(float(job.meta.get("pause_s", 5)))
    return {"task": task}


def finish_once_handed_back(task: dict[str, Any]) -> dict[str, Any]:
    """First run: wait until the worker hands the job back (no longer started), then return
    as if the task had just finished. Later runs return at once."""
    job = _record_run()
    runs = int(job.connection.hget(RUNS_KEY, job.id) or 0)
    while runs == 1 and job.get_status(refresh=True) == "started":
        time.sleep(0.05)
    return {"task": task, "run": runs}
