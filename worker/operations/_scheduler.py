"""One scheduling round (``agent-worker schedule``): explorations for agents gone quiet.

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

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

import anyio
from redis import Redis
from redis.exceptions import RedisError

from hub_client import AgentSummary, HubClient
from hub_client.retry_rules import Backoff
from worker.agents import AgentStore
from worker.enqueue import (
    DEFAULT_QUEUE,
    DEFAULT_RESULT_TTL_S,
    DEFAULT_TIMEOUT_GRACE_S,
    enqueue_task,
)
from worker.exceptions import AgentConfigError, InvalidTask
from worker.logs import log_event
from worker.operations._agent_state import (
    AgentState,
    LastRun,
    last_run_of,
    load_agent_state,
    save_agent_state,
)
from worker.task import Task, TaskType

DEFAULT_INTERVAL_S = 60.0
DEFAULT_MIN_STALENESS_S = 900
DEFAULT_MAX_PER_ROUND = 50
DEFAULT_MAX_BACKOFF_S = 24 * 3600.0
# A leader that dies without releasing the lock holds it this long at most (in intervals).
LOCK_TTL_INTERVALS = 3
MIN_LOCK_TTL_S = 30.0


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
        return Backoff(first_s=self.interval_s, max_s=self.max_backoff_s).delay_s(failures)

    @property
    def lock_ttl_s(self) -> float:
        return max(self.interval_s * LOCK_TTL_INTERVALS, MIN_LOCK_TTL_S)


def exploration_task_id(agent_id: str, slot: int) -> str:
    return f"explore-{agent_id}-{slot}"


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
        save_agent_state(self.redis, agent_id, state)
        if not enqueued.enqueued:
            return Decision.IN_FLIGHT, None
        return Decision.ENQUEUED, task.task_id

    def _settle(self, agent_id: str, now: float) -> tuple[AgentState, bool]:
        """Count the agent's last exploration into its failure streak, once it is over.

        Returns the state and whether that exploration is still queued or running.
        """
        state = load_agent_state(self.redis, agent_id)
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
        save_agent_state(self.redis, agent_id, state)
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
