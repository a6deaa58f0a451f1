"""A real ``rq worker agents`` (selected by RQ_WORKER_CLASS) against a real redis-server."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Callback, Queue, Retry, Worker
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, ScheduledJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import now

from tests.support import jobs
from tests.support.jobs import process_running
from tests.support.redis_server import free_port, running_redis
from tests.support.workers import (
    TestAgentWorker,
    parse_events,
    run_burst_worker,
    running_worker,
    wait_until,
)
from worker import logs
from worker.daemon import AgentWorker
from worker.enqueue import JOB_FUNCTION, _enqueue_call
from worker.task import parse_task

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def task(task_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "type": "notification",
        "agent_id": "devops-agent",
        "post_id": "p-42",
        **changes,
    }


def enqueue(
    connection: redis.Redis, raw_task: dict[str, Any], function: str, *, delay_s: float = 0
) -> str:
    """Enqueue through the production Lua script, naming a test job function."""
    result = _enqueue_call(
        connection,
        parse_task(raw_task),
        function_name=function,
        queue_name="agents",
        result_ttl_s=3600,
        timeout_grace_s=60,
        delay_s=delay_s,
        attempt=0,
    )
    return result.status


def fetch(connection: redis.Redis, job_id: str) -> Job:
    return Job.fetch(job_id, connection=connection, serializer=JSONSerializer)


def runs(connection: redis.Redis, job_id: str) -> int:
    return int(connection.hget(jobs.RUNS_KEY, job_id) or 0)


def failure_text(connection: redis.Redis, job_id: str) -> str:
    result = Result.fetch_latest(fetch(connection, job_id), serializer=JSONSerializer)
    assert result is not None and result.exc_string is not None
    return result.exc_string


def json_queue(connection: redis.Redis) -> Queue:
    return Queue("agents", connection=connection, serializer=JSONSerializer)


def test_script_written_job_runs_once_with_its_timeout(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    raw = task("t-1", constraints={"max_duration_s": 120})
    first = enqueue(redis_conn, raw, "tests.support.jobs.echo_task")
    again = enqueue(redis_conn, {**raw, "post_id": "p-other"}, "tests.support.jobs.echo_task")

    run = run_burst_worker(redis_url)

    assert (first, again) == ("enqueued", "duplicate")
    assert run.returncode == 0, run.stderr
    job = fetch(redis_conn, "t-1")
    assert job.get_status() is JobStatus.FINISHED
    wire = parse_task(raw).model_dump(mode="json", exclude_none=True)
    assert job.return_value() == {"task": wire, "timeout": 180}
    assert runs(redis_conn, "t-1") == 1


def test_high_priority_task_runs_first(redis_conn: redis.Redis, redis_url: str) -> None:
    enqueue(redis_conn, task("first"), "tests.support.jobs.echo_task")
    enqueue(redis_conn, task("second"), "tests.support.jobs.echo_task")
    enqueue(redis_conn, task("urgent", priority="high"), "tests.support.jobs.echo_task")

    run = run_burst_worker(redis_url)

    assert run.returncode == 0, run.stderr
    # The order rq took them in, as its log says; a concurrent worker runs them side by side.
    taken = [
        match.group(1)
        for event in parse_events(run.stderr, "rq_log")
        if (match := re.fullmatch(r".*: agents: notification task .* \((\S+)\)", event["message"]))
    ]
    assert taken == ["urgent", "first", "second"]
    assert sorted(redis_conn.lrange(jobs.ORDER_KEY, 0, -1)) == [b"first", b"second", b"urgent"]


def test_delayed_task_runs_only_after_its_delay_through_the_scheduler(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    status = enqueue(redis_conn, task("later"), "tests.support.jobs.echo_task", delay_s=5)
    due = redis_conn.zscore(ScheduledJobRegistry.key_template.format("agents"), "later")
    assert status == "scheduled" and due is not None

    early = run_burst_worker(redis_url)
    ended_before_due = time.time() < due

    assert early.returncode == 0, early.stderr
    if ended_before_due:
        assert fetch(redis_conn, "later").get_status() is JobStatus.SCHEDULED
        assert runs(redis_conn, "later") == 0
    wait_until(lambda: time.time() >= due + 0.5, 30, "the task to be due")
    # A plain `rq worker --burst` runs no scheduler: only AgentWorker's forced one moves it.
    late = run_burst_worker(redis_url)

    assert late.returncode == 0, late.stderr
    job = fetch(redis_conn, "later")
    assert job.get_status() is JobStatus.FINISHED
    assert job.started_at is not None and job.started_at.timestamp() >= due
    assert runs(redis_conn, "later") == 1


def test_foreign_functions_are_refused_without_importing_or_running_them(
    redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "executed"
    queue = json_queue(redis_conn)
    queue.enqueue("tests.support.jobs.write_marker", str(marker), job_id="marker")
    queue.enqueue("os.getcwd", job_id="getcwd")
    queue.enqueue("tests.support.never_imported.run", job_id="unknown-module")
    queue.enqueue(
        "tests.support.jobs.echo_task",
        task("callback"),
        job_id="callback",
        on_failure=Callback("tests.support.jobs.write_marker"),
    )
    garbage_names: list[Any] = [None, [], {"a": 1}, 42]
    for number, garbage_name in enumerate(garbage_names):
        job = queue.enqueue("tests.support.jobs.echo_task", task("x"), job_id=f"garbage-{number}")
        call = json.dumps([garbage_name, None, [], {}]).encode()
        redis_conn.hset(job.key, "data", zlib.compress(call))
    enqueue(redis_conn, task("after"), "tests.support.jobs.echo_task")

    run = run_burst_worker(redis_url)

    assert run.returncode == 0, run.stderr
    refused = ["marker", "getcwd", "unknown-module", "callback"] + [
        f"garbage-{n}" for n in range(4)
    ]
    failed = FailedJobRegistry("agents", connection=redis_conn).get_job_ids()
    assert set(refused) <= set(failed)
    allowed = ", ".join(sorted(TestAgentWorker.allowed_functions))
    assert failure_text(redis_conn, "getcwd") == (
        f"job function 'os.getcwd' is not allowed; this worker runs only {allowed}"
    )
    assert "'tests.support.never_imported.run' is not allowed" in failure_text(
        redis_conn, "unknown-module"
    )
    assert "failure_callback_name" in failure_text(redis_conn, "callback")
    assert "job function None is not allowed" in failure_text(redis_conn, "garbage-0")
    assert not marker.exists()
    assert {event["job_id"] for event in run.events("job_refused")} == set(refused)
    assert fetch(redis_conn, "after").get_status() is JobStatus.FINISHED
    assert runs(redis_conn, "callback") == 0


def test_undecodable_jobs_fail_visibly_and_the_next_job_runs(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    pickle_queue = Queue("agents", connection=redis_conn)  # rq's default serializer
    pickle_queue.enqueue("tests.support.jobs.echo_task", task("pickled"), job_id="pickled")
    not_json = json_queue(redis_conn).enqueue(
        "tests.support.jobs.echo_task", task("x"), job_id="not-json"
    )
    redis_conn.hset(not_json.key, "data", b"\x00\xffnot json at all")
    unloadable = json_queue(redis_conn).enqueue(
        "tests.support.jobs.echo_task", task("x"), job_id="unloadable"
    )
    redis_conn.hset(unloadable.key, "created_at", "not a date")
    enqueue(redis_conn, task("after"), "tests.support.jobs.echo_task")

    run = run_burst_worker(redis_url)

    assert run.returncode == 0, run.stderr
    events = {event["job_id"]: event["reason"] for event in run.events("job_undecodable")}
    assert set(events) == {"pickled", "not-json", "unloadable"}
    assert "rq.serializers.JSONSerializer" in events["pickled"]
    assert "cannot be loaded" in events["unloadable"]
    assert "JSONSerializer" in failure_text(redis_conn, "pickled")
    assert "JSONSerializer" in failure_text(redis_conn, "not-json")
    failed_key = FailedJobRegistry.key_template.format("agents")
    for job_id in events:
        assert redis_conn.zscore(failed_key, job_id) is not None, job_id
        assert redis_conn.hget(f"rq:job:{job_id}", "status") == b"failed", job_id
    assert b"cannot be loaded" in (redis_conn.hget("rq:job:unloadable", "exc_info") or b"")
    assert fetch(redis_conn, "after").get_status() is JobStatus.FINISHED
    assert redis_conn.hlen(jobs.RUNS_KEY) == 1


def test_invalid_tasks_are_never_retried(redis_conn: redis.Redis, redis_url: str) -> None:
    queue = json_queue(redis_conn)
    queue.enqueue(
        "tests.support.jobs.fail_as_invalid", task("x"), job_id="invalid-outcome", retry=Retry(3)
    )
    malformed = {"task_id": "bad id!", "type": "exploration", "agent_id": "devops-agent"}
    queue.enqueue("tests.support.jobs.fail", malformed, job_id="malformed", retry=Retry(3))
    queue.enqueue("tests.support.jobs.fail", task("x"), job_id="ordinary", retry=Retry(1))

    run = run_burst_worker(redis_url)

    assert run.returncode == 0, run.stderr
    assert runs(redis_conn, "invalid-outcome") == 1
    assert runs(redis_conn, "malformed") == 1
    # The control: an ordinary failure does use its retry.
    assert runs(redis_conn, "ordinary") == 2
    for job_id in ("invalid-outcome", "malformed", "ordinary"):
        assert fetch(redis_conn, job_id).get_status() is JobStatus.FAILED, job_id


def test_process_group_left_by_a_job_is_killed(redis_conn: redis.Redis, redis_url: str) -> None:
    enqueue(redis_conn, task("spawner"), "tests.support.jobs.spawn_child")

    run = run_burst_worker(redis_url)

    child_pid = fetch(redis_conn, "spawner").return_value()
    assert isinstance(child_pid, int)
    try:
        assert run.returncode == 0, run.stderr
        wait_until(lambda: not process_running(child_pid), 30, f"process {child_pid} to end")
        killed = run.events("child_processes_killed")
        assert [event["pids"] for event in killed] == [[child_pid]]
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child_pid, signal.SIGKILL)


def test_requeue_request_puts_the_same_task_back_with_its_delay(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    raw = task("again", constraints={"max_duration_s": 100})
    enqueue(redis_conn, raw, "tests.support.jobs.ask_requeue")

    run = run_burst_worker(redis_url)

    assert run.returncode == 0, run.stderr
    assert runs(redis_conn, "again") == 1
    job = fetch(redis_conn, "again")
    assert job.get_status() is JobStatus.SCHEDULED
    assert job.func_name == JOB_FUNCTION
    assert job.args == [parse_task(raw).model_dump(mode="json", exclude_none=True)]
    assert job.meta == {"attempt": 2}
    assert job.timeout == 160
    due = redis_conn.zscore(ScheduledJobRegistry.key_template.format("agents"), "again")
    assert due is not None and due >= time.time() + 20
    # The first run was recorded by rq before the task went back.
    first_run = Result.fetch_latest(job, serializer=JSONSerializer)
    assert first_run is not None and first_run.return_value == {"outcome": "requeued"}
    (requeued,) = run.events("task_reenqueued")
    assert (requeued["delay_s"], requeued["attempt"], requeued["status"]) == (30, 2, "scheduled")


def test_worker_rides_out_redis_restarts() -> None:
    with running_redis() as server:
        connection = redis.Redis.from_url(server.url)
        with running_worker(server.url) as worker:
            server.start_again()
            # A longer outage: the worker must back off, not quit.
            server.stop()
            time.sleep(3)
            server.start_again()
            enqueue(connection, task("after-restart"), "tests.support.jobs.echo_task")

            wait_until(
                lambda: connection.hget("rq:job:after-restart", "status") == b"finished",
                60,
                "the job enqueued after the restarts",
            )

            assert worker.process.poll() is None
        assert worker.process.returncode == 0
        quitting = [e for e in worker.events("rq_log") if "quitting" in str(e.get("message"))]
        assert quitting == []
        connection.close()


def test_heartbeats_do_not_raise_while_redis_is_down() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    job = Job.create(
        "tests.support.jobs.echo_task", connection=dead, id="x", serializer=JSONSerializer
    )
    job.started_at = now()
    execution = Execution("e-1", "x", connection=dead)
    with pytest.raises(redis.ConnectionError):
        Worker(["agents"], connection=dead, prepare_for_work=False).maintain_heartbeats(
            job, execution
        )
    worker = AgentWorker(["agents"], connection=dead, prepare_for_work=False)
    log = io.StringIO()
    logs.set_stream(log)
    try:
        worker.maintain_heartbeats(job, execution)
        worker.heartbeat()
        worker.set_state("idle")
    finally:
        logs.set_stream(None)
        dead.close()

    during = [json.loads(line)["during"] for line in log.getvalue().splitlines()]
    assert during == ["maintain_heartbeats", "heartbeat", "set_state"]


def test_constructing_the_worker_touches_nothing_and_forces_json(
    redis_conn: redis.Redis,
) -> None:
    pickle_queue = Queue("agents", connection=redis_conn)

    worker = AgentWorker([pickle_queue], connection=redis_conn, maintenance_interval=600)
    explicit = AgentWorker("agents", connection=redis_conn, maintenance_interval=120)

    assert redis_conn.keys("*") == []
    assert worker.serializer is JSONSerializer
    assert [queue.serializer for queue in worker.queues] == [JSONSerializer]
    assert worker.queue_names() == ["agents"]
    assert worker.maintenance_interval == 60
    assert explicit.maintenance_interval == 120
    assert AgentWorker.all(connection=redis_conn) == []
