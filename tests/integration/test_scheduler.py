"""``agent-worker schedule`` against a real redis-server, the real devhub and real rq workers."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from tests.support.definitions import explorer, write_agent
from tests.support.devhub import DevHub, running_devhub
from tests.support.workers import REPO_ROOT, parse_events, run_burst, wait_until, worker_env
from worker.agents import AgentStore, DefinitionPolicy
from worker.operations._agent_state import AgentState, agent_state_key
from worker.operations._scheduler import (
    Decision,
    HubStaleAgents,
    ScheduleConfig,
    Scheduler,
    exploration_task_id,
)
from worker.redis_io import keys as redis_keys

pytestmark = pytest.mark.integration

INTERVAL_S = 60.0
START = 1_800_000_000.0  # a slot boundary
SLOT = 30_000_000
LONG_AGO = (datetime.now(UTC) - timedelta(days=2)).isoformat()


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def devhub() -> Iterator[DevHub]:
    with running_devhub(api_key="scheduler-test-hub-key") as hub:
        yield hub


@pytest.fixture
def hub(devhub: DevHub) -> DevHub:
    devhub.reset()
    return devhub


@pytest.fixture
def agents_root(tmp_path: Path) -> Path:
    for name in ("alpha-agent", "beta-agent", "fresh-agent"):
        write_agent(tmp_path, name, explorer(name))
    write_agent(tmp_path, "quiet-agent", explorer("quiet-agent", discovery=False))
    return tmp_path


FLAKY_KEY_ALLOWED = DefinitionPolicy(agent_key_envs=frozenset({"FLAKY_PROVIDER_KEY"}))


def make_scheduler(
    redis_conn: redis.Redis, hub: DevHub, agents_root: Path, clock: Clock, **config: Any
) -> Scheduler:
    settings: dict[str, Any] = {"interval_s": INTERVAL_S, **config}
    return Scheduler(
        redis_conn,
        # The operator allows the flaky agent's key variable (AGENT_KEY_ENVS).
        AgentStore(str(agents_root), redis=redis_conn, policy=FLAKY_KEY_ALLOWED),
        HubStaleAgents(hub.url, hub.api_key, timeout_s=10),
        ScheduleConfig(**settings),
        clock=clock,
    )


def queued_ids(redis_conn: redis.Redis) -> list[str]:
    raw_ids = redis_conn.lrange("rq:queue:agents", 0, -1)
    return [raw.decode() for raw in raw_ids if isinstance(raw, bytes)]


def fetch(redis_conn: redis.Redis, job_id: str) -> Job:
    return Job.fetch(job_id, connection=redis_conn, serializer=JSONSerializer)


def scheduler_env(redis_url: str, hub: DevHub, agents_root: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RQ_")}
    env.update(
        REDIS_URL=redis_url,
        AGENTS_DIR=str(agents_root),
        PYTHONPATH=str(REPO_ROOT),
        **hub.env,
    )
    return env


def test_only_stale_agents_are_enqueued_oldest_first(
    redis_conn: redis.Redis, hub: DevHub, agents_root: Path
) -> None:
    hub.register_agent("alpha-agent", last_activated_at=LONG_AGO)
    hub.register_agent("beta-agent")  # never activated: the oldest of all
    hub.register_agent("fresh-agent", last_activated_at=datetime.now(UTC).isoformat())

    result = make_scheduler(redis_conn, hub, agents_root, Clock()).run_round()

    expected = [exploration_task_id("beta-agent", SLOT), exploration_task_id("alpha-agent", SLOT)]
    assert result.enqueued == expected
    assert queued_ids(redis_conn) == expected
    assert "fresh-agent" not in result.decisions
    task = fetch(redis_conn, expected[1]).args[0]
    assert (task["type"], task["agent_id"], task["task_id"]) == (
        "exploration",
        "alpha-agent",
        expected[1],
    )


def test_disabled_discovery_and_unknown_agents_are_skipped(
    redis_conn: redis.Redis, hub: DevHub, agents_root: Path, log_stream: io.StringIO
) -> None:
    for agent_id in ("quiet-agent", "ghost-agent", "alpha-agent"):
        hub.register_agent(agent_id, last_activated_at=LONG_AGO)

    result = make_scheduler(redis_conn, hub, agents_root, Clock()).run_round()

    assert result.decisions == {
        "quiet-agent": Decision.DISCOVERY_OFF,
        "ghost-agent": Decision.BROKEN_DEFINITION,
        "alpha-agent": Decision.ENQUEUED,
    }
    assert queued_ids(redis_conn) == [exploration_task_id("alpha-agent", SLOT)]
    skipped = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert [e["agent"] for e in skipped if e["event"] == "agent_skipped"] == ["ghost-agent"]


def test_a_second_round_in_the_same_slot_enqueues_nothing_new(
    redis_conn: redis.Redis, hub: DevHub, agents_root: Path
) -> None:
    hub.register_agent("alpha-agent", last_activated_at=LONG_AGO)
    hub.register_agent("beta-agent", last_activated_at=LONG_AGO)
    clock = Clock()
    scheduler = make_scheduler(redis_conn, hub, agents_root, clock)

    first = scheduler.run_round()
    clock.now += INTERVAL_S - 1
    second = scheduler.run_round()
    # Another scheduler without our state would still collide on the deterministic ids.
    redis_conn.delete(agent_state_key("alpha-agent"), agent_state_key("beta-agent"))
    third = make_scheduler(redis_conn, hub, agents_root, clock).run_round()

    assert len(first.enqueued) == 2
    assert second.enqueued == [] and third.enqueued == []
    assert set(third.decisions.values()) == {Decision.IN_FLIGHT}
    assert sorted(queued_ids(redis_conn)) == sorted(first.enqueued)


def run_worker_burst(redis_url: str, hub: DevHub, agents_root: Path) -> str:
    """A real ``rq worker agents --burst`` with only environment variables set."""
    env = worker_env(redis_url)
    env.update(AGENTS_DIR=str(agents_root), **hub.env)
    env.pop("FLAKY_PROVIDER_KEY", None)
    env["AGENT_KEY_ENVS"] = "FLAKY_PROVIDER_KEY"
    completed = run_burst(env, timeout_s=90)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stderr


def finish(redis_conn: redis.Redis, task_id: str, outcome: str) -> None:
    """Record a successful run the way rq does (for a run we do not need a model for)."""
    job = fetch(redis_conn, task_id)
    job.meta["report"] = {"task_id": task_id, "outcome": outcome}
    job.save_meta()  # type: ignore[no-untyped-call]
    redis_conn.lrem("rq:queue:agents", 0, task_id)
    job.set_status(JobStatus.FINISHED)
    FinishedJobRegistry("agents", connection=redis_conn).add(job, ttl=3600)


def test_failed_explorations_back_off_exponentially_and_a_success_resets(
    redis_conn: redis.Redis, redis_url: str, hub: DevHub, tmp_path: Path, log_stream: io.StringIO
) -> None:
    # The provider key this agent names is never set: every real run fails.
    brain = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "FLAKY_PROVIDER_KEY"}
    write_agent(tmp_path, "flaky-agent", explorer("flaky-agent", brain=brain))
    hub.register_agent("flaky-agent", last_activated_at=LONG_AGO)
    clock = Clock()
    # Any activation counts as stale at once, so the agent stays on the Hub's list.
    scheduler = make_scheduler(redis_conn, hub, tmp_path, clock, min_staleness_s=0)

    def round_at(offset_s: float) -> Decision:
        clock.now = START + offset_s
        return scheduler.run_round().decisions["flaky-agent"]

    assert round_at(0) is Decision.ENQUEUED
    first_task = exploration_task_id("flaky-agent", SLOT)
    worker_log = run_worker_burst(redis_url, hub, tmp_path)
    assert fetch(redis_conn, first_task).get_status() is JobStatus.FAILED
    assert first_task in FailedJobRegistry("agents", connection=redis_conn)
    # Failure 1, seen at +60: two intervals, until +180.
    assert [round_at(t) for t in (60, 179, 180)] == [
        Decision.BACKING_OFF,
        Decision.BACKING_OFF,
        Decision.ENQUEUED,
    ]
    run_worker_burst(redis_url, hub, tmp_path)
    # Failure 2, seen at +240: four intervals, until +480.
    assert [round_at(t) for t in (240, 479, 480)] == [
        Decision.BACKING_OFF,
        Decision.BACKING_OFF,
        Decision.ENQUEUED,
    ]
    finish(redis_conn, exploration_task_id("flaky-agent", SLOT + 8), "completed")
    assert round_at(540) is Decision.ENQUEUED

    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    backoffs = [r for r in records if r["event"] == "agent_backoff"]
    real_outcome = parse_events(worker_log, "task_completed")[0]["outcome"]
    assert [(b["failures"], b["backoff_s"], b["outcome"]) for b in backoffs] == [
        (1, 120, real_outcome),
        (2, 240, real_outcome),
    ]
    assert [r["previous_failures"] for r in records if r["event"] == "agent_backoff_reset"] == [2]
    state = AgentState.decode(redis_conn.hgetall(agent_state_key("flaky-agent")))
    assert state.failures == 0


@dataclass
class SchedulerProcess:
    process: subprocess.Popen[bytes]
    log: Path

    def events(self, name: str) -> list[dict[str, Any]]:
        return parse_events(self.log.read_text(encoding="utf-8", errors="replace"), name)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@contextmanager
def scheduler_process(env: dict[str, str], log: Path, *args: str) -> Iterator[SchedulerProcess]:
    """A long-running ``agent-worker schedule``; killed on the way out if still running."""
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.operations", "schedule", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield SchedulerProcess(process=process, log=log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_one_leader_enqueues_a_follower_waits_and_takes_over_after_sigterm(
    redis_conn: redis.Redis, redis_url: str, hub: DevHub, agents_root: Path, tmp_path: Path
) -> None:
    hub.register_agent("alpha-agent", last_activated_at=LONG_AGO)
    hub.register_agent("beta-agent", last_activated_at=LONG_AGO)
    env = scheduler_env(redis_url, hub, agents_root)

    with scheduler_process(env, tmp_path / "leader.log", "--interval-s", "0.2") as leader:
        wait_until(lambda: leader.events("schedule_round"), 30, "the leader's first round")
        with scheduler_process(env, tmp_path / "follower.log", "--interval-s", "0.2") as follower:
            wait_until(lambda: follower.events("scheduler_follower"), 30, "the follower")
            once = subprocess.run(
                [sys.executable, "-m", "worker.operations", "schedule", "--once"],
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            follower_rounds_while_led = follower.events("schedule_round")
            leader_code = leader.stop()
            wait_until(lambda: follower.events("schedule_round"), 30, "the follower taking over")
            follower_code = follower.stop()

    assert once.returncode == 0, once.stderr
    assert "another scheduler holds the lock" in once.stdout
    assert follower_rounds_while_led == []
    assert follower.events("scheduler_leader")
    assert (leader_code, follower_code) == (0, 0)
    assert leader.events("scheduler_stopped") and follower.events("scheduler_stopped")
    # Each agent was enqueued once in all: the new leader found both explorations in flight.
    queued = queued_ids(redis_conn)
    assert len(queued) == len(set(queued)) == 2
    assert {fetch(redis_conn, job_id).args[0]["agent_id"] for job_id in queued} == {
        "alpha-agent",
        "beta-agent",
    }
    assert redis_conn.exists(redis_keys.SCHEDULER_LEADER) == 0


def test_once_enqueues_and_leaves_the_lock_free_for_the_next_cron_run(
    redis_conn: redis.Redis, redis_url: str, hub: DevHub, agents_root: Path
) -> None:
    hub.register_agent("alpha-agent", last_activated_at=LONG_AGO)

    once = subprocess.run(
        [sys.executable, "-m", "worker.operations", "schedule", "--once"],
        cwd=REPO_ROOT,
        env=scheduler_env(redis_url, hub, agents_root),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert once.returncode == 0, once.stderr
    [round_event] = parse_events(once.stderr, "schedule_round")
    assert round_event["enqueued"] == 1
    assert [fetch(redis_conn, job_id).args[0]["agent_id"] for job_id in queued_ids(redis_conn)] == [
        "alpha-agent"
    ]
    assert redis_conn.exists(redis_keys.SCHEDULER_LEADER) == 0
