"""``agent-worker status``, ``requeue`` and ``reload-agents`` on real Redis, workers and jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from tests.support.definitions import explorer, write_agent
from tests.support.devhub import DevHub, running_devhub
from tests.support.scripted_llm import running_scripted_llm
from tests.support.workers import REPO_ROOT, run_burst, running_worker, wait_until, worker_env
from worker.agents import AgentStore
from worker.enqueue import _enqueue_call, enqueue_task
from worker.hub_writes import OutboxItem, park
from worker.task import parse_task

pytestmark = pytest.mark.integration

GHOST_TASK = {"task_id": "t-ghost", "type": "exploration", "agent_id": "ghost-agent"}


@pytest.fixture(scope="module")
def devhub() -> Iterator[DevHub]:
    with running_devhub() as hub:
        yield hub


@pytest.fixture
def hub(devhub: DevHub) -> DevHub:
    devhub.reset()
    return devhub


def command_env(redis_url: str, agents_root: Path) -> dict[str, str]:
    env = worker_env(redis_url)
    env["AGENTS_DIR"] = str(agents_root)
    return env


def agent_worker(
    module: str, args: list[str], redis_url: str, agents_root: Path
) -> subprocess.CompletedProcess[str]:
    """One operator command, as its own process with only environment variables set."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env=command_env(redis_url, agents_root),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def status_json(redis_url: str, agents_root: Path) -> dict[str, Any]:
    completed = agent_worker("worker.operations", ["status", "--json"], redis_url, agents_root)
    assert completed.returncode == 0, completed.stderr
    parsed: dict[str, Any] = json.loads(completed.stdout)
    return parsed


def fail_for_real(redis_url: str, hub: DevHub, agents_root: Path) -> None:
    """Run the queue with a real ``rq worker agents --burst``: tasks of unknown agents fail."""
    env = command_env(redis_url, agents_root)
    env.update(hub.env)
    completed = run_burst(env, timeout_s=90)
    assert completed.returncode == 0, completed.stderr[-3000:]


def queued_ids(redis_conn: redis.Redis) -> list[str]:
    raw_ids = redis_conn.lrange("rq:queue:agents", 0, -1)
    return [raw.decode() for raw in raw_ids if isinstance(raw, bytes)]


def fetch(redis_conn: redis.Redis, job_id: str) -> Job:
    return Job.fetch(job_id, connection=redis_conn, serializer=JSONSerializer)


def test_status_json_shows_queues_the_failure_with_its_outcome_and_the_outbox(
    redis_conn: redis.Redis, redis_url: str, hub: DevHub, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, GHOST_TASK)
    # A job that raises without a report: rq's own error text is all there is.
    _enqueue_call(
        redis_conn,
        parse_task({"task_id": "t-crash", "type": "exploration", "agent_id": "a-b-c"}),
        function_name="tests.support.jobs.fail",
        queue_name="agents",
        result_ttl_s=3600,
        timeout_grace_s=60,
        delay_s=0,
        attempt=0,
    )
    fail_for_real(redis_url, hub, tmp_path)
    enqueue_task(redis_conn, {"task_id": "t-waiting", "type": "exploration", "agent_id": "a-b-c"})
    park(
        redis_conn,
        OutboxItem(kind="activated", payload={"agent_id": "a-b-c"}, idempotency_key="k:1"),
        delay_s=60,
    )

    status = status_json(redis_url, tmp_path)

    assert status["schema_version"] == 1
    [agents_queue] = [queue for queue in status["queues"] if queue["name"] == "agents"]
    assert agents_queue == {
        "name": "agents",
        "queued": 1,
        "started": 0,
        "scheduled": 0,
        "deferred": 0,
        "finished": 0,
        "failed": 2,
        "canceled": 0,
    }
    # Newest first: the burst worker ran t-ghost, then t-crash.
    crash, failure = status["recent_failures"]
    assert crash == {
        "task_id": "t-crash",
        "queue": "agents",
        "agent_id": "a-b-c",
        "type": "exploration",
        "outcome": None,
        "error": "RuntimeError: this job always fails",
        "failed_at": crash["failed_at"],
    }
    assert failure["task_id"] == "t-ghost"
    assert failure["agent_id"] == "ghost-agent"
    assert failure["type"] == "exploration"
    assert failure["outcome"] == "invalid_task"
    assert failure["error"].startswith("InvalidTask: unknown agent 'ghost-agent'")
    assert failure["failed_at"] < crash["failed_at"]
    assert status["workers"] == []  # the burst worker is gone
    assert status["outbox"] == {"pending": 1, "dead": 0, "newest_dead": None}

    table = agent_worker("worker.operations", ["status"], redis_url, tmp_path)
    assert table.returncode == 0, table.stderr
    assert "t-ghost" in table.stdout and "invalid_task" in table.stdout
    assert "OUTBOX  pending 1  dead 0" in table.stdout


def test_status_shows_a_busy_worker_with_the_task_agent_and_step(
    redis_conn: redis.Redis,
    redis_url: str,
    hub: DevHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_agent(
        tmp_path,
        "busy-agent",
        explorer("busy-agent"),
        prompt="You are busy-agent. [[scenario:busy]]",
    )
    with running_scripted_llm() as llm:
        # Step 1 calls a tool that does not exist (the loop goes on); step 2 takes its time.
        llm.set_scenario(
            "busy",
            [
                {"tool_calls": [{"name": "hub__no_such_tool", "arguments": {}}]},
                {"text": "All done.", "delay_s": 15},
            ],
        )
        # running_worker passes the test's environment on to the worker.
        for name, value in {**llm.env, **hub.env, "AGENTS_DIR": str(tmp_path)}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("OPENAI_API_KEY", "scripted-endpoint-key")
        with running_worker(redis_url) as worker_process:
            enqueue_task(
                redis_conn, {"task_id": "t-busy", "type": "exploration", "agent_id": "busy-agent"}
            )

            def busy_worker() -> dict[str, Any]:
                for entry in status_json(redis_url, tmp_path)["workers"]:
                    job = entry["current_job"]
                    if job is not None and job["step"] >= 1:
                        return dict(entry)
                return {}

            busy = wait_until(busy_worker, 60, "a worker at step 1 of t-busy")
            worker_process.wait_for_event("task_completed", timeout_s=60)

    assert busy["state"] == "busy"
    assert busy["queues"] == ["agents"]
    assert busy["pid"] is not None and busy["hostname"]
    assert busy["current_job"]["task_id"] == "t-busy"
    assert busy["current_job"]["agent_id"] == "busy-agent"
    assert busy["current_job"]["type"] == "exploration"
    assert busy["current_job"]["step"] == 1
    assert busy["current_job"]["elapsed_s"] >= 0


def test_requeue_puts_a_failed_task_back_exactly_once(
    redis_conn: redis.Redis, redis_url: str, hub: DevHub, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, {**GHOST_TASK, "priority": "high"})
    fail_for_real(redis_url, hub, tmp_path)
    failed = FailedJobRegistry("agents", connection=redis_conn)
    assert "t-ghost" in failed

    requeued = agent_worker("worker.operations", ["requeue", "t-ghost"], redis_url, tmp_path)
    again = agent_worker("worker.operations", ["requeue", "t-ghost"], redis_url, tmp_path)

    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout.strip() == "requeued t-ghost"
    assert queued_ids(redis_conn) == ["t-ghost"]
    assert "t-ghost" not in failed
    job = fetch(redis_conn, "t-ghost")
    assert job.get_status() is JobStatus.QUEUED
    assert job.meta == {"attempt": 0}  # the old report and attempt are gone
    assert job.args[0] == {**GHOST_TASK, "priority": "high", "constraints": {}}
    assert again.returncode == 2
    assert "t-ghost: not in the failed registry of queue agents (status queued)" in again.stderr
    assert queued_ids(redis_conn) == ["t-ghost"]


def test_requeue_refuses_unknown_ids_and_then_requeues_nothing(
    redis_conn: redis.Redis, redis_url: str, hub: DevHub, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, GHOST_TASK)
    fail_for_real(redis_url, hub, tmp_path)

    refused = agent_worker(
        "worker.operations", ["requeue", "t-ghost", "t-nobody", "../x"], redis_url, tmp_path
    )

    assert refused.returncode == 2
    assert "t-nobody: unknown task" in refused.stderr
    assert "'../x': not a task id" in refused.stderr
    assert "nothing was requeued" in refused.stderr
    assert queued_ids(redis_conn) == []
    assert "t-ghost" in FailedJobRegistry("agents", connection=redis_conn)


def test_reload_agents_drops_cached_definitions(
    redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    for name in ("alpha-agent", "beta-agent", "gamma-agent"):
        write_agent(tmp_path, name, explorer(name))
    store = AgentStore(str(tmp_path), redis=redis_conn)
    for name in ("alpha-agent", "beta-agent", "gamma-agent"):
        store.load(name)

    one = agent_worker("worker.operations", ["reload-agents", "alpha-agent"], redis_url, tmp_path)
    rest = agent_worker("worker.operations", ["reload-agents"], redis_url, tmp_path)
    none_left = agent_worker("worker.operations", ["reload-agents"], redis_url, tmp_path)
    malformed = agent_worker("worker.operations", ["reload-agents", "Bad/Id"], redis_url, tmp_path)

    assert (one.returncode, one.stdout.strip()) == (0, "dropped 1 cached agent definition")
    assert (rest.returncode, rest.stdout.strip()) == (0, "dropped 2 cached agent definitions")
    assert none_left.stdout.strip() == "dropped 0 cached agent definitions"
    assert malformed.returncode == 2 and "'Bad/Id' is not an agent id" in malformed.stderr
    assert list(redis_conn.scan_iter(match="agent-worker:agent:*")) == []
