"""The scheduler's decisions, backoff arithmetic and leader lock, on fakeredis with a fake Hub."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from hub_client import AgentSummary, HubUnavailable
from tests.support.definitions import explorer, write_agent
from worker.agents import AgentStore
from worker.enqueue import JOB_FUNCTION
from worker.operations._agent_state import AgentState, LastRun, agent_state_key, last_run_of
from worker.operations._leader_lock import LeaderLock
from worker.operations._schedule import run_forever, run_once
from worker.operations._scheduler import Decision, ScheduleConfig, Scheduler, exploration_task_id
from worker.redis_io import keys as redis_keys

INTERVAL_S = 60.0
START = 1_800_000_000.0  # a slot boundary: 30_000_000 * 60


class FakeHub:
    """Answers the stale list it was given; counts calls; can stop a run_forever loop."""

    def __init__(self, *agent_ids: str) -> None:
        self.agent_ids = list(agent_ids)
        self.calls = 0
        self.stop_after: tuple[int, threading.Event] | None = None
        self.failure: Exception | None = None

    def stale_agents(self, min_staleness_s: int) -> list[AgentSummary]:
        self.calls += 1
        if self.stop_after is not None and self.calls >= self.stop_after[0]:
            self.stop_after[1].set()
        if self.failure is not None:
            raise self.failure
        return [AgentSummary(id=agent_id) for agent_id in self.agent_ids]


class Clock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def agents_root(tmp_path: Path) -> Path:
    for name in ("alpha-agent", "beta-agent", "gamma-agent"):
        write_agent(tmp_path, name, explorer(name))
    write_agent(tmp_path, "quiet-agent", explorer("quiet-agent", discovery=False))
    return tmp_path


def logged(stream: io.StringIO, name: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [record for record in records if record["event"] == name]


def make_scheduler(
    redis: fakeredis.FakeRedis,
    agents_root: Path,
    hub: FakeHub,
    clock: Clock,
    **config: Any,
) -> Scheduler:
    store = AgentStore(str(agents_root), redis=redis, ttl_s=0)
    settings: dict[str, Any] = {"interval_s": INTERVAL_S, **config}
    return Scheduler(redis, store, hub, ScheduleConfig(**settings), clock=clock)


def queued_ids(redis: fakeredis.FakeRedis) -> list[str]:
    return [
        raw.decode() for raw in redis.lrange("rq:queue:agents", 0, -1) if isinstance(raw, bytes)
    ]


def settle_job(redis: fakeredis.FakeRedis, task_id: str, outcome: str, *, failed: bool) -> None:
    """What a worker leaves behind: the job off the queue, its report, its registry."""
    queue = Queue("agents", connection=redis, serializer=JSONSerializer)
    job = Job.fetch(task_id, connection=redis, serializer=JSONSerializer)
    queue.remove(job)
    job.meta["report"] = {"task_id": task_id, "outcome": outcome}
    job.save_meta()  # type: ignore[no-untyped-call]
    job.set_status(JobStatus.FAILED if failed else JobStatus.FINISHED)
    if failed:
        FailedJobRegistry(queue=queue).add(job, exc_string="TaskFailed: boom")
    else:
        FinishedJobRegistry(queue=queue).add(job, ttl=3600)


def test_slot_task_id_and_capped_exponential_backoff() -> None:
    config = ScheduleConfig(interval_s=60, max_backoff_s=3600)

    assert config.slot(START) == 30_000_000
    assert config.slot(START + 59.9) == 30_000_000
    assert config.slot(START + 60) == 30_000_001
    assert exploration_task_id("alpha-agent", 7) == "explore-alpha-agent-7"
    assert [config.backoff_s(n) for n in range(1, 7)] == [120, 240, 480, 960, 1920, 3600]
    assert config.backoff_s(10_000) == 3600
    assert ScheduleConfig(interval_s=1).lock_ttl_s == 30
    assert ScheduleConfig(interval_s=600).lock_ttl_s == 1800


def test_agent_state_survives_a_round_trip_through_redis(redis: fakeredis.FakeRedis) -> None:
    state = AgentState(task_id="explore-a-1", slot=1, settled=False, failures=3, not_before=12.5)
    redis.hset("state", mapping=dict[Any, Any](state.encode()))

    assert AgentState.decode(redis.hgetall("state")) == state
    assert AgentState.decode({}) == AgentState()


def test_round_enqueues_stale_agents_in_hub_order_and_skips_discovery_off(
    redis: fakeredis.FakeRedis, agents_root: Path, log_stream: io.StringIO
) -> None:
    hub = FakeHub("beta-agent", "quiet-agent", "alpha-agent")
    scheduler = make_scheduler(redis, agents_root, hub, Clock())

    result = scheduler.run_round()

    slot = 30_000_000
    expected = [exploration_task_id("beta-agent", slot), exploration_task_id("alpha-agent", slot)]
    assert result.enqueued == expected
    assert queued_ids(redis) == expected
    assert result.decisions["quiet-agent"] is Decision.DISCOVERY_OFF
    job = Job.fetch(expected[0], connection=redis, serializer=JSONSerializer)
    assert job.func_name == JOB_FUNCTION
    assert job.args[0] == {
        "task_id": expected[0],
        "type": "exploration",
        "agent_id": "beta-agent",
        "priority": "low",
        "constraints": {},
    }
    [round_event] = logged(log_stream, "schedule_round")
    assert round_event["enqueued"] == 2 and round_event["discovery_off"] == 1
    assert round_event["stale"] == 3 and round_event["slot"] == slot


def test_unknown_or_broken_definitions_are_skipped_and_logged(
    redis: fakeredis.FakeRedis, agents_root: Path, log_stream: io.StringIO
) -> None:
    write_agent(agents_root, "broken-agent", "name: broken-agent\nbrain: {provider: nobody}\n")
    hub = FakeHub("ghost-agent", "broken-agent", "Not An Id", "alpha-agent")

    result = make_scheduler(redis, agents_root, hub, Clock()).run_round()

    assert result.enqueued == [exploration_task_id("alpha-agent", 30_000_000)]
    for agent_id in ("ghost-agent", "broken-agent", "Not An Id"):
        assert result.decisions[agent_id] is Decision.BROKEN_DEFINITION
    skipped = {event["agent"]: event["reason"] for event in logged(log_stream, "agent_skipped")}
    assert "unknown agent 'ghost-agent'" in skipped["ghost-agent"]
    assert "brain.provider" in skipped["broken-agent"]
    assert "invalid agent id" in skipped["Not An Id"]


def test_same_slot_enqueues_nothing_again_even_after_the_run_finished(
    redis: fakeredis.FakeRedis, agents_root: Path
) -> None:
    clock = Clock()
    scheduler = make_scheduler(redis, agents_root, FakeHub("alpha-agent"), clock)
    first = scheduler.run_round()
    clock.advance(30)
    while_queued = scheduler.run_round()
    settle_job(redis, first.enqueued[0], "completed", failed=False)
    after_finish = scheduler.run_round()

    assert len(first.enqueued) == 1
    assert while_queued.enqueued == [] and after_finish.enqueued == []
    assert while_queued.decisions["alpha-agent"] is Decision.IN_FLIGHT
    assert after_finish.decisions["alpha-agent"] is Decision.EXPLORED_THIS_SLOT
    assert queued_ids(redis) == []


def test_an_exploration_still_queued_blocks_the_next_slot(
    redis: fakeredis.FakeRedis, agents_root: Path
) -> None:
    clock = Clock()
    scheduler = make_scheduler(redis, agents_root, FakeHub("alpha-agent"), clock)
    scheduler.run_round()
    clock.advance(INTERVAL_S * 5)

    later = scheduler.run_round()

    assert later.decisions["alpha-agent"] is Decision.IN_FLIGHT
    assert queued_ids(redis) == [exploration_task_id("alpha-agent", 30_000_000)]


def test_max_per_round_leaves_the_rest_for_the_next_round(
    redis: fakeredis.FakeRedis, agents_root: Path
) -> None:
    clock = Clock()
    hub = FakeHub("alpha-agent", "quiet-agent", "beta-agent", "gamma-agent")
    scheduler = make_scheduler(redis, agents_root, hub, clock, max_per_round=2)

    first = scheduler.run_round()
    clock.advance(INTERVAL_S)
    second = scheduler.run_round()

    assert [d.value for d in first.decisions.values()] == [
        "enqueued",
        "discovery_off",
        "enqueued",
        "over_limit",
    ]
    assert second.enqueued == [exploration_task_id("gamma-agent", 30_000_001)]
    assert len(queued_ids(redis)) == 3


def test_failures_back_off_exponentially_and_a_success_resets(
    redis: fakeredis.FakeRedis, agents_root: Path, log_stream: io.StringIO
) -> None:
    clock = Clock()
    scheduler = make_scheduler(redis, agents_root, FakeHub("alpha-agent"), clock)

    def round_at(offset_s: float) -> Decision:
        clock.now = START + offset_s
        return scheduler.run_round().decisions["alpha-agent"]

    assert round_at(0) is Decision.ENQUEUED
    settle_job(redis, exploration_task_id("alpha-agent", 30_000_000), "error", failed=True)
    # Failure 1 seen at +60: back off 2 intervals, until +180.
    assert [round_at(t) for t in (60, 120, 180)] == [
        Decision.BACKING_OFF,
        Decision.BACKING_OFF,
        Decision.ENQUEUED,
    ]
    # A finished run with a failing outcome (tool_loop) counts too: failure 2 at +240, until +480.
    settle_job(redis, exploration_task_id("alpha-agent", 30_000_003), "tool_loop", failed=False)
    assert [round_at(t) for t in (240, 420, 480)] == [
        Decision.BACKING_OFF,
        Decision.BACKING_OFF,
        Decision.ENQUEUED,
    ]
    settle_job(redis, exploration_task_id("alpha-agent", 30_000_008), "completed", failed=False)
    assert round_at(540) is Decision.ENQUEUED

    backoffs = logged(log_stream, "agent_backoff")
    assert [(e["failures"], e["backoff_s"], e["outcome"]) for e in backoffs] == [
        (1, 120, "error"),
        (2, 240, "tool_loop"),
    ]
    [reset] = logged(log_stream, "agent_backoff_reset")
    assert reset["previous_failures"] == 2
    state = AgentState.decode(redis.hgetall(agent_state_key("alpha-agent")))
    assert state.failures == 0 and state.task_id == exploration_task_id("alpha-agent", 30_000_009)


def test_last_run_reads_rq_states(redis: fakeredis.FakeRedis, agents_root: Path) -> None:
    scheduler = make_scheduler(redis, agents_root, FakeHub("alpha-agent"), Clock())
    [task_id] = scheduler.run_round().enqueued

    assert last_run_of(redis, task_id) == (LastRun.PENDING, None)
    assert last_run_of(redis, "explore-nobody-1") == (LastRun.UNKNOWN, None)
    settle_job(redis, task_id, "budget_unhealthy", failed=False)
    assert last_run_of(redis, task_id) == (LastRun.SUCCEEDED, "budget_unhealthy")
    Job.fetch(task_id, connection=redis, serializer=JSONSerializer).set_status(JobStatus.CANCELED)
    assert last_run_of(redis, task_id)[0] is LastRun.UNKNOWN


def test_leader_lock_is_held_by_one_token_renewed_and_released_only_by_it(
    redis: fakeredis.FakeRedis,
) -> None:
    first = LeaderLock(redis, ttl_s=30, token="host-a:1:x")
    second = LeaderLock(redis, ttl_s=30, token="host-b:2:y")

    assert first.hold() is True
    assert second.hold() is False
    assert first.hold() is True  # renewal
    assert 0 < redis.pttl(redis_keys.SCHEDULER_LEADER) <= 30_000
    assert second.release() is False
    assert second.holder() == "host-a:1:x"
    assert first.release() is True
    assert second.hold() is True


def test_run_once_as_follower_says_who_leads_and_enqueues_nothing(
    redis: fakeredis.FakeRedis, agents_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    LeaderLock(redis, ttl_s=30, token="other-host:99:z").hold()
    hub = FakeHub("alpha-agent")
    scheduler = make_scheduler(redis, agents_root, hub, Clock())

    code = run_once(scheduler, LeaderLock(redis, ttl_s=30))

    assert code == 0
    assert "another scheduler holds the lock (other-host:99:z)" in capsys.readouterr().out
    assert hub.calls == 0 and queued_ids(redis) == []


def test_run_once_as_leader_runs_one_round_and_releases_the_lock(
    redis: fakeredis.FakeRedis, agents_root: Path
) -> None:
    scheduler = make_scheduler(redis, agents_root, FakeHub("alpha-agent"), Clock())

    code = run_once(scheduler, LeaderLock(redis, ttl_s=30))

    assert code == 0
    assert len(queued_ids(redis)) == 1
    assert redis.exists(redis_keys.SCHEDULER_LEADER) == 0


def test_run_once_fails_with_exit_1_when_the_hub_is_down(
    redis: fakeredis.FakeRedis, agents_root: Path, log_stream: io.StringIO
) -> None:
    hub = FakeHub("alpha-agent")
    hub.failure = HubUnavailable("GET /agents: connection refused", method="GET", path="/agents")
    scheduler = make_scheduler(redis, agents_root, hub, Clock())

    code = run_once(scheduler, LeaderLock(redis, ttl_s=30))

    assert code == 1
    assert "connection refused" in logged(log_stream, "schedule_round_failed")[0]["error"]
    assert redis.exists(redis_keys.SCHEDULER_LEADER) == 0


def test_run_forever_survives_a_failed_round_and_releases_the_lock_when_stopped(
    redis: fakeredis.FakeRedis, agents_root: Path, log_stream: io.StringIO
) -> None:
    stop = threading.Event()
    hub = FakeHub("alpha-agent")
    hub.failure = HubUnavailable("GET /agents: timed out", method="GET", path="/agents")
    hub.stop_after = (1, stop)
    scheduler = make_scheduler(redis, agents_root, hub, Clock(), interval_s=0.01)

    code = run_forever(scheduler, LeaderLock(redis, ttl_s=30), stop)

    assert code == 0
    assert [e["event"] for e in logged(log_stream, "scheduler_leader")] == ["scheduler_leader"]
    assert len(logged(log_stream, "schedule_round_failed")) == 1
    assert len(logged(log_stream, "scheduler_stopped")) == 1
    assert redis.exists(redis_keys.SCHEDULER_LEADER) == 0
