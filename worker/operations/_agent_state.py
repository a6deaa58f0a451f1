"""What the scheduler remembers of each agent between rounds, and how its last run went.

The state is a Redis hash per agent (``agent_state_key``), so a new leader goes on where
the last one stopped; ``last_run_of`` reads the verdict of an exploration from rq.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from worker.redis_io import keys as redis_keys
from worker.task import Outcome

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


def agent_state_key(agent_id: str) -> str:
    return redis_keys.scheduler_agent(agent_id)


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


def save_agent_state(redis: Redis, agent_id: str, state: AgentState) -> None:
    """Replace the agent's remembered state, kept for ``AGENT_STATE_TTL_S``."""
    key = agent_state_key(agent_id)
    with redis.pipeline() as pipe:
        pipe.delete(key)
        pipe.hset(key, items=[part for pair in state.encode().items() for part in pair])
        pipe.expire(key, AGENT_STATE_TTL_S)
        pipe.execute()


def load_agent_state(redis: Redis, agent_id: str) -> AgentState:
    """The agent's remembered state; a fresh one when the scheduler never saw it."""
    return AgentState.decode(redis.hgetall(agent_state_key(agent_id)))
