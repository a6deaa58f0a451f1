"""``agent-worker schedule``: enqueue explorations for the agents the Hub has not seen for a while.

One round, run by the leader every ``--interval-s`` seconds:

    ask the Hub for stale agents              GET /agents?stale=true (oldest first)
    settle each agent's last exploration      failed → one failure more; ran fine → reset
    skip the agent                            while that run is still queued or running,
                                              when it already had this time slot,
                                              while it backs off (interval * 2^failures, capped),
                                              when its definition turns discovery off or is broken
    enqueue ``explore-<agent>-<slot>``        slot = floor(now / interval): a repeat is a no-op

Several schedulers may run at once: only the holder of the leader lock (SET NX PX
with a token, renewed every round, released on exit) enqueues, the others wait to
take over. Per-agent state lives in Redis, so a new leader goes on where the last
one stopped. With ``--once`` (cron), the slot length is still ``--interval-s``:
give it the cron period.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import FrameType
from typing import Any, Protocol

import anyio
from redis import Redis
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from hub_client import AgentSummary, HubClient, HubError
from worker import redis_keys
from worker.agents import AgentStore
from worker.cli import redis_url_parser, use_redis_url
from worker.enqueue import (
    DEFAULT_QUEUE,
    DEFAULT_RESULT_TTL_S,
    DEFAULT_TIMEOUT_GRACE_S,
    enqueue_task,
)
from worker.exceptions import AgentConfigError, InvalidTask
from worker.logs import log_event, set_level, set_redactor
from worker.redaction import process_redactor
from worker.redis_connection import connect
from worker.redis_faults import is_redis_outage, outage_kind, patient_redis_retry
from worker.settings import settings_or_exit
from worker.task import Outcome, Task, TaskType

DEFAULT_INTERVAL_S = 60.0
DEFAULT_MIN_STALENESS_S = 900
DEFAULT_MAX_PER_ROUND = 50
DEFAULT_MAX_BACKOFF_S = 24 * 3600.0
# A leader that dies without releasing the lock holds it this long at most (in intervals).
LOCK_TTL_INTERVALS = 3
MIN_LOCK_TTL_S = 30.0
# Longer than the longest backoff and than the result TTL of the job the state points at.
AGENT_STATE_TTL_S = 8 * 86_400

# rq states in which a job has yet to run or is running.
_NOT_DONE = frozenset(
    {
        JobStatus.CREATED,
        JobStatus.QUEUED,
        JobStatus.STARTED,
        JobStatus.DEFERRED,
        JobStatus.SCHEDULED,
        JobStatus.RATE_LIMITED,
        JobStatus.READY_TO_ENQUEUE,
    }
)
# Finished runs with these outcomes count as failures too (they are posted to m/agent-errors).
_FAILING_OUTCOMES = frozenset(outcome.value for outcome in Outcome if outcome.posts_error)

_ACQUIRE_OR_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    interval_s: float = DEFAULT_INTERVAL_S
    min_staleness_s: int = DEFAULT_MIN_STALENESS_S
    max_per_round: int = DEFAULT_MAX_PER_ROUND
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    queue_name: str = DEFAULT_QUEUE
    result_ttl_s: int = DEFAULT_RESULT_TTL_S
    timeout_grace_s: int = DEFAULT_TIMEOUT_GRACE_S

    def slot(self, at: float) -> int:
        """The time slot ``at`` falls in; one exploration per agent and slot at most."""
        return math.floor(at / self.interval_s)

    def backoff_s(self, failures: int) -> float:
        """How long an agent waits after its ``failures``-th failure in a row."""
        # The exponent is capped so a long failure streak cannot overflow a float.
        return float(min(self.interval_s * 2 ** min(failures, 40), self.max_backoff_s))

    @property
    def lock_ttl_s(self) -> float:
        return max(self.interval_s * LOCK_TTL_INTERVALS, MIN_LOCK_TTL_S)


def exploration_task_id(agent_id: str, slot: int) -> str:
    return f"explore-{agent_id}-{slot}"


def agent_state_key(agent_id: str) -> str:
    return redis_keys.scheduler_agent(agent_id)


class Decision(StrEnum):
    """What a round did with one stale agent."""

    ENQUEUED = "enqueued"
    IN_FLIGHT = "in_flight"  # its last exploration is still queued or running
    EXPLORED_THIS_SLOT = "explored_this_slot"
    BACKING_OFF = "backing_off"
    DISCOVERY_OFF = "discovery_off"
    BROKEN_DEFINITION = "broken_definition"
    OVER_LIMIT = "over_limit"  # beyond --max-per-round; the next round takes it


@dataclass(kw_only=True)
class RoundResult:
    slot: int
    decisions: dict[str, Decision] = field(default_factory=dict)
    enqueued: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        tally = Counter(self.decisions.values())
        return {decision.value: tally[decision] for decision in Decision}


class LastRun(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # expired, deleted, stopped or canceled: says nothing about the agent


@dataclass(kw_only=True)
class AgentState:
    """What the scheduler remembers of one agent between rounds (a Redis hash)."""

    task_id: str | None = None
    slot: int | None = None
    settled: bool = True
    failures: int = 0
    not_before: float = 0.0

    @classmethod
    def decode(cls, fields: Mapping[Any, Any]) -> AgentState:
        """From HGETALL's answer (bytes keys and values; str with ``decode_responses``)."""

        def text(name: str) -> str | None:
            raw = fields.get(name.encode(), fields.get(name))
            if isinstance(raw, bytes):
                raw = raw.decode()
            return raw or None

        slot = text("slot")
        return cls(
            task_id=text("task_id"),
            slot=int(slot) if slot else None,
            settled=text("settled") != "0",
            failures=int(text("failures") or 0),
            not_before=float(text("not_before") or 0),
        )

    def encode(self) -> dict[str, str]:
        fields = {
            "settled": "1" if self.settled else "0",
            "failures": str(self.failures),
            "not_before": repr(self.not_before),
        }
        if self.task_id is not None:
            fields["task_id"] = self.task_id
        if self.slot is not None:
            fields["slot"] = str(self.slot)
        return fields


class StaleAgentSource(Protocol):
    def stale_agents(self, min_staleness_s: int) -> list[AgentSummary]:
        """Agents not activated for ``min_staleness_s`` seconds, oldest first."""
        ...


class HubStaleAgents:
    """The Hub's ``GET /agents?stale=true``, for synchronous callers (one client per call)."""

    def __init__(self, hub_url: str, api_key: str | None, *, timeout_s: float) -> None:
        self._hub_url = hub_url
        self._api_key = api_key
        self._timeout_s = timeout_s

    def stale_agents(self, min_staleness_s: int) -> list[AgentSummary]:
        return anyio.run(self._fetch, min_staleness_s)

    async def _fetch(self, min_staleness_s: int) -> list[AgentSummary]:
        async with HubClient(self._hub_url, self._api_key, timeout_s=self._timeout_s) as hub:
            return await hub.stale_agents(min_staleness_s=min_staleness_s)


class Scheduler:
    """Runs rounds; whoever calls ``run_round`` must hold the LeaderLock."""

    def __init__(
        self,
        redis: Redis,
        agents: AgentStore,
        hub: StaleAgentSource,
        config: ScheduleConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.agents = agents
        self.hub = hub
        self.config = config
        self._clock = clock

    def run_round(self) -> RoundResult:
        """One round over the Hub's stale agents; raises HubError or RedisError when unreachable."""
        now = self._clock()
        result = RoundResult(slot=self.config.slot(now))
        stale = self.hub.stale_agents(self.config.min_staleness_s)
        for agent in stale:
            if agent.id in result.decisions:
                continue
            has_room = len(result.enqueued) < self.config.max_per_round
            decision, task_id = self._consider(agent.id, now=now, slot=result.slot, room=has_room)
            result.decisions[agent.id] = decision
            if task_id is not None:
                result.enqueued.append(task_id)
        fields: dict[str, Any] = {"slot": result.slot, "stale": len(stale), **result.counts()}
        log_event("schedule_round", **fields)
        return result

    def _consider(
        self, agent_id: str, *, now: float, slot: int, room: bool
    ) -> tuple[Decision, str | None]:
        state, still_running = self._settle(agent_id, now)
        if still_running:
            return Decision.IN_FLIGHT, None
        if state.slot == slot:
            return Decision.EXPLORED_THIS_SLOT, None
        if now < state.not_before:
            return Decision.BACKING_OFF, None
        if not room:
            return Decision.OVER_LIMIT, None
        skipped = self._definition_skips(agent_id)
        if skipped is not None:
            return skipped, None
        task = Task(
            task_id=exploration_task_id(agent_id, slot),
            type=TaskType.EXPLORATION,
            agent_id=agent_id,
            priority="low",
        )
        enqueued = enqueue_task(
            self.redis,
            task,
            queue_name=self.config.queue_name,
            result_ttl_s=self.config.result_ttl_s,
            timeout_grace_s=self.config.timeout_grace_s,
        )
        # A duplicate is that very task already waiting: follow it all the same.
        state.task_id, state.slot, state.settled = task.task_id, slot, False
        self._save(agent_id, state)
        if not enqueued.enqueued:
            return Decision.IN_FLIGHT, None
        return Decision.ENQUEUED, task.task_id

    def _settle(self, agent_id: str, now: float) -> tuple[AgentState, bool]:
        """Count the agent's last exploration into its failure streak, once it is over.

        Returns the state and whether that exploration is still queued or running.
        """
        state = AgentState.decode(self.redis.hgetall(agent_state_key(agent_id)))
        if state.task_id is None or state.settled:
            return state, False
        last_run, outcome = last_run_of(self.redis, state.task_id)
        if last_run is LastRun.PENDING:
            return state, True
        if last_run is LastRun.FAILED:
            state.failures += 1
            backoff_s = self.config.backoff_s(state.failures)
            state.not_before = now + backoff_s
            log_event(
                "agent_backoff",
                "warning",
                agent=agent_id,
                task=state.task_id,
                outcome=outcome,
                failures=state.failures,
                backoff_s=backoff_s,
                until=datetime.fromtimestamp(state.not_before, UTC).isoformat(timespec="seconds"),
            )
        elif last_run is LastRun.SUCCEEDED:
            if state.failures:
                log_event(
                    "agent_backoff_reset",
                    agent=agent_id,
                    task=state.task_id,
                    previous_failures=state.failures,
                )
            state.failures, state.not_before = 0, 0.0
        state.settled = True
        self._save(agent_id, state)
        return state, False

    def _definition_skips(self, agent_id: str) -> Decision | None:
        try:
            definition = self.agents.load(agent_id)
        except (InvalidTask, AgentConfigError) as exc:
            log_event("agent_skipped", "warning", agent=agent_id, reason=exc.message)
            return Decision.BROKEN_DEFINITION
        except RedisError:
            raise  # an outage is the round's business, not this agent's
        except Exception as exc:  # whatever else one definition trips skips it alone
            reason = f"could not load its definition ({type(exc).__name__}: {exc})"[:500]
            log_event("agent_skipped", "warning", agent=agent_id, reason=reason)
            return Decision.BROKEN_DEFINITION
        if not definition.config.behavior.discovery.enabled:
            return Decision.DISCOVERY_OFF
        return None

    def _save(self, agent_id: str, state: AgentState) -> None:
        key = agent_state_key(agent_id)
        with self.redis.pipeline() as pipe:
            pipe.delete(key)
            pipe.hset(key, items=[part for pair in state.encode().items() for part in pair])
            pipe.expire(key, AGENT_STATE_TTL_S)
            pipe.execute()


def last_run_of(redis: Redis, task_id: str) -> tuple[LastRun, str | None]:
    """How the exploration ``task_id`` went, from rq: the verdict and the report's outcome."""
    try:
        job = Job.fetch(task_id, connection=redis, serializer=JSONSerializer)
    except (NoSuchJobError, ValueError):
        return LastRun.UNKNOWN, None
    report = job.meta.get("report")
    outcome = report.get("outcome") if isinstance(report, dict) else None
    outcome_text = str(outcome) if outcome is not None else None
    status = job.get_status(refresh=False)
    if status in _NOT_DONE:
        return LastRun.PENDING, outcome_text
    if status is JobStatus.FAILED:
        return LastRun.FAILED, outcome_text or "failed"
    if status is JobStatus.FINISHED:
        failed = outcome_text in _FAILING_OUTCOMES
        return (LastRun.FAILED if failed else LastRun.SUCCEEDED), outcome_text
    return LastRun.UNKNOWN, outcome_text


class LeaderLock:
    """The scheduler leader lock: SET NX PX with this process's token, renewed by its holder."""

    def __init__(
        self,
        redis: Redis,
        *,
        ttl_s: float,
        key: str = redis_keys.SCHEDULER_LEADER,
        token: str | None = None,
    ) -> None:
        self.redis = redis
        self.key = key
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        # Says who holds it, for the operator reading a follower's message.
        self.token = token or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._acquire_or_renew = redis.register_script(_ACQUIRE_OR_RENEW)
        self._release = redis.register_script(_RELEASE)

    def hold(self) -> bool:
        """Take the lock if it is free, extend it if it is ours; False when another holds it."""
        return bool(self._acquire_or_renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> bool:
        """Give the lock up if it is still ours."""
        return bool(self._release(keys=[self.key], args=[self.token]))

    def holder(self) -> str | None:
        raw = self.redis.get(self.key)
        return raw.decode() if isinstance(raw, bytes) else None


def run_once(scheduler: Scheduler, lock: LeaderLock) -> int:
    """One round if this process can lead (cron); 0 also when another scheduler leads."""
    try:
        if not lock.hold():
            print(
                f"agent-worker schedule: another scheduler holds the lock "
                f"({lock.holder() or 'just released'}); nothing enqueued"
            )
            return 0
        try:
            scheduler.run_round()
        finally:
            lock.release()
    except (RedisError, HubError) as exc:
        _log_round_failure(exc)
        return 1
    return 0


def run_forever(scheduler: Scheduler, lock: LeaderLock, stop: threading.Event) -> int:
    """Lead or wait, one round per interval, until ``stop`` is set; releases the lock on exit."""
    # None until the first turn, so that turn always logs which role this process has.
    leading: bool | None = None
    log_event(
        "scheduler_started",
        token=lock.token,
        interval_s=scheduler.config.interval_s,
        min_staleness_s=scheduler.config.min_staleness_s,
        max_per_round=scheduler.config.max_per_round,
    )
    try:
        while not stop.is_set():
            leading = _turn(scheduler, lock, was_leading=leading)
            stop.wait(scheduler.config.interval_s)
    finally:
        with suppress(RedisError):
            lock.release()
        log_event("scheduler_stopped", token=lock.token)
    return 0


def _turn(scheduler: Scheduler, lock: LeaderLock, *, was_leading: bool | None) -> bool:
    try:
        leading = lock.hold()
        if leading != was_leading:
            if leading:
                log_event("scheduler_leader", token=lock.token)
            else:
                log_event("scheduler_follower", token=lock.token, holder=lock.holder())
        if leading:
            scheduler.run_round()
    except (RedisError, HubError) as exc:
        _log_round_failure(exc)
        return False
    return leading


def _log_round_failure(exc: Exception) -> None:
    """A Redis outage or refusal is an outage (the next round tries again), not a bug."""
    if is_redis_outage(exc):
        log_event(
            "redis_unavailable",
            "warning",
            during="schedule_round",
            kind=outage_kind(exc),
            error=str(exc),
        )
    else:
        log_event("schedule_round_failed", "error", error=str(exc))


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    watched = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, request_stop) for signum in watched}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-worker schedule",
        description="Enqueue exploration tasks for stale agents (one leader at a time).",
        parents=[redis_url_parser()],
    )
    parser.add_argument("--once", action="store_true", help="run one round and exit (cron)")
    parser.add_argument(
        "--interval-s",
        type=_positive_float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between rounds, and the length of a slot (default %(default)s)",
    )
    parser.add_argument(
        "--min-staleness-s",
        type=_count(0),
        default=DEFAULT_MIN_STALENESS_S,
        help="an agent is stale after this many seconds without activation (default %(default)s)",
    )
    parser.add_argument(
        "--max-per-round",
        type=_count(1),
        default=DEFAULT_MAX_PER_ROUND,
        help="enqueue at most this many explorations per round (default %(default)s)",
    )
    return parser


def main(argv: list[str]) -> int:
    """``agent-worker schedule [--once] [--interval-s] [--min-staleness-s] [--max-per-round]``."""
    args = _parser().parse_args(argv)
    use_redis_url(args.redis_url)
    settings = settings_or_exit()
    set_level(settings.log_level)
    set_redactor(process_redactor(settings.secret_values()))
    config = ScheduleConfig(
        interval_s=args.interval_s,
        min_staleness_s=args.min_staleness_s,
        max_per_round=args.max_per_round,
        result_ttl_s=settings.result_ttl_s,
        timeout_grace_s=settings.job_timeout_grace_s,
    )
    redis = connect(settings)
    # The worker's patience: a restart or a refused write (OOM, READONLY) is waited out.
    redis.set_retry(patient_redis_retry())
    agents = AgentStore(settings.agents_dir, redis=redis, ttl_s=settings.agent_cache_ttl_s)
    api_key = settings.hub_api_key.get_secret_value() if settings.hub_api_key else None
    hub = HubStaleAgents(settings.hub_url, api_key, timeout_s=settings.hub_timeout_s)
    scheduler = Scheduler(redis, agents, hub, config)
    lock = LeaderLock(redis, ttl_s=config.lock_ttl_s)
    stop = threading.Event()
    try:
        # With --once, a SIGTERM lets the round finish and release the lock.
        with _stop_on_signals(stop):
            return run_once(scheduler, lock) if args.once else run_forever(scheduler, lock, stop)
    finally:
        agents.close()
        redis.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
