"""The fleet at a glance, read from Redis, for ``agent-worker status [--json] [--failures N]``.

Queues by state, live workers and what each runs, the latest failures, the
outbox. Read-only, apart from rq forgetting the keys of workers that expired:
registry counts skip rq's cleanup, which would move abandoned jobs. Exit 0, or
1 when Redis cannot be reached.

``--json`` prints one object whose schema is stable (``schema_version`` grows
only on a breaking change; new fields may be added). Times are ISO 8601 in
UTC with milliseconds, so they sort as strings::

    field                         type             meaning
    schema_version                int              1
    generated_at                  str              when the reading was taken
    queues[]                                       every rq queue, "agents" always
      .name                       str
      .queued .started .scheduled int              jobs in each state
      .deferred .finished
      .failed .canceled
    workers[]                                      live rq workers (expired ones are gone)
      .name .state                str              state: idle, busy, suspended, ...
      .hostname                   str | null
      .pid                        int | null
      .queues                     [str]
      .last_heartbeat             str | null
      .current_job                object | null    null when idle
        .task_id                  str
        .agent_id .type           str | null       null when the job data cannot be read
        .started_at               str | null
        .elapsed_s                float | null
        .step                     int              model responses in the task's checkpoint
    recent_failures[]                              newest first, at most --failures
      .task_id .queue             str
      .agent_id .type             str | null
      .outcome                    str | null       AgentReport outcome; null without a report
      .error                      str | null       "Class: message", else rq's last error line
      .failed_at                  str | null
    requeued[]                                     tasks the worker put back, waiting, next first
      .task_id .queue             str
      .agent_id                   str | null
      .attempt                    int              the run it waits for (1 is the first requeue)
      .reason                     str              why it was put back
      .next_try_at                str | null       when it is due (null: due, moving to its queue)
    outbox.pending                int              Hub writes waiting for a retry
    outbox.dead                   int              dead letters: Hub writes the Hub refused or
                                                   that ran out of attempts, kept for an operator
    outbox.newest_dead            object | null    the newest dead letter (replay or drop it with
                                                   ``agent-worker dead-letters``)
      .id                         str              its idempotency key
      .kind                       str              comment, post, consumption, ...
      .attempts                   int
      .status                     int | null       the Hub's HTTP status, null without one
      .error                      str
      .dead_at                    str | null
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.worker import Worker

from worker.enqueue import DEFAULT_QUEUE
from worker.hub_writes import outbox_size
from worker.loop import ResponseEntry, entry_from_json
from worker.operations._dead_letters import dead_letter_count, newest_dead_letter
from worker.operations._job_lookup import requeue_note
from worker.redis_io import CappedJob
from worker.redis_io import keys as redis_keys

SCHEMA_VERSION = 1
DEFAULT_FAILURES_SHOWN = 10
STATES = ("queued", "started", "scheduled", "deferred", "finished", "failed", "canceled")
_REGISTRIES = {
    "started": StartedJobRegistry,
    "scheduled": ScheduledJobRegistry,
    "deferred": DeferredJobRegistry,
    "finished": FinishedJobRegistry,
    "failed": FailedJobRegistry,
    "canceled": CanceledJobRegistry,
}


@dataclass(frozen=True, kw_only=True)
class QueueDepth:
    name: str
    queued: int
    started: int
    scheduled: int
    deferred: int
    finished: int
    failed: int
    canceled: int


@dataclass(frozen=True, kw_only=True)
class RunningJob:
    task_id: str
    agent_id: str | None
    type: str | None
    started_at: str | None
    elapsed_s: float | None
    step: int


@dataclass(frozen=True, kw_only=True)
class WorkerInfo:
    name: str
    hostname: str | None
    pid: int | None
    state: str
    queues: list[str]
    last_heartbeat: str | None
    current_job: RunningJob | None


@dataclass(frozen=True, kw_only=True)
class Failure:
    task_id: str
    queue: str
    agent_id: str | None
    type: str | None
    outcome: str | None
    error: str | None
    failed_at: str | None


@dataclass(frozen=True, kw_only=True)
class Requeued:
    task_id: str
    queue: str
    agent_id: str | None
    attempt: int
    reason: str
    next_try_at: str | None


@dataclass(frozen=True, kw_only=True)
class OutboxState:
    pending: int
    dead: int
    newest_dead: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class FleetStatus:
    generated_at: str
    queues: list[QueueDepth]
    workers: list[WorkerInfo]
    recent_failures: list[Failure]
    outbox: OutboxState
    requeued: list[Requeued]

    def to_json(self) -> dict[str, Any]:
        """The documented ``--json`` object (see the module docstring)."""
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}


def collect_status(
    redis: Redis,
    *,
    failures_shown: int = DEFAULT_FAILURES_SHOWN,
    redact: Callable[[str], str] = str,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> FleetStatus:
    """Read the fleet's state from Redis; raises RedisError when Redis cannot be reached."""
    now = clock()
    queue_names = _queue_names(redis)
    return FleetStatus(
        generated_at=now.astimezone(UTC).isoformat(timespec="milliseconds"),
        queues=[_queue_depth(redis, name) for name in queue_names],
        workers=_workers(redis, now),
        recent_failures=_recent_failures(redis, queue_names, failures_shown, redact),
        outbox=_outbox_state(redis, redact),
        requeued=_requeued(redis, queue_names, redact),
    )


def _outbox_state(redis: Redis, redact: Callable[[str], str]) -> OutboxState:
    newest = newest_dead_letter(redis)
    summary = newest.summary() if newest is not None else None
    if summary is not None:
        summary["error"] = redact(summary["error"])
    return OutboxState(
        pending=outbox_size(redis), dead=dead_letter_count(redis), newest_dead=summary
    )


# --- queues ------------------------------------------------------------------------------------


def _queue_names(redis: Redis) -> list[str]:
    known = {queue.name for queue in Queue.all(connection=redis, serializer=JSONSerializer)}
    return sorted(known | {DEFAULT_QUEUE})


def _queue_depth(redis: Redis, name: str) -> QueueDepth:
    counts = {
        state: registry(name, connection=redis, serializer=JSONSerializer).get_job_count(
            cleanup=False
        )
        for state, registry in _REGISTRIES.items()
    }
    queued = int(redis.llen(Queue.redis_queue_namespace_prefix + name))
    return QueueDepth(name=name, queued=queued, **counts)


# --- workers -----------------------------------------------------------------------------------


def _workers(redis: Redis, now: datetime) -> list[WorkerInfo]:
    workers = []
    for worker in Worker.all(connection=redis, serializer=JSONSerializer):
        job_id = worker.get_current_job_id()
        workers.append(
            WorkerInfo(
                name=worker.name,
                hostname=worker.hostname,
                pid=worker.pid,
                state=worker.get_state(),
                queues=worker.queue_names(),
                last_heartbeat=_iso(worker.last_heartbeat),
                current_job=_running_job(redis, job_id, now) if job_id else None,
            )
        )
    return sorted(workers, key=lambda info: (info.hostname or "", info.name))


def _running_job(redis: Redis, job_id: str, now: datetime) -> RunningJob:
    job = _fetch(redis, job_id)
    task = _task_of(job) if job is not None else {}
    started_at = job.started_at if job is not None else None
    elapsed_s = round((now - started_at).total_seconds(), 1) if started_at else None
    return RunningJob(
        task_id=job_id,
        agent_id=_text(task.get("agent_id")),
        type=_text(task.get("type")),
        started_at=_iso(started_at),
        elapsed_s=elapsed_s,
        step=model_steps(redis, job_id),
    )


def model_steps(redis: Redis, task_id: str) -> int:
    """How many model responses the task's checkpoint holds (its step, as the loop counts)."""
    steps = 0
    for raw in redis.lrange(redis_keys.checkpoint(task_id), 0, -1):
        try:
            entry = entry_from_json(raw)
        except (ValueError, KeyError, TypeError):
            continue
        steps += isinstance(entry, ResponseEntry)
    return steps


# --- requeued tasks -----------------------------------------------------------------------------

# The scheduled registries are read this far, next due first.
_REQUEUED_SHOWN = 50


def _requeued(
    redis: Redis, queue_names: Sequence[str], redact: Callable[[str], str]
) -> list[Requeued]:
    found = []
    for name in queue_names:
        key = ScheduledJobRegistry.key_template.format(name)
        for raw_id in redis.zrange(key, 0, _REQUEUED_SHOWN - 1):
            job_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            job = _fetch(redis, job_id)
            note = requeue_note(redis, job) if job is not None else None
            if job is None or note is None:
                continue
            found.append(
                Requeued(
                    task_id=job_id,
                    queue=name,
                    agent_id=_text(_task_of(job).get("agent_id")),
                    attempt=note.attempt,
                    reason=redact(note.reason),
                    next_try_at=note.next_try_at,
                )
            )
    found.sort(key=lambda requeued: requeued.next_try_at or "")
    return found


# --- failures ----------------------------------------------------------------------------------


def _recent_failures(
    redis: Redis, queue_names: Sequence[str], limit: int, redact: Callable[[str], str]
) -> list[Failure]:
    if limit <= 0:
        return []
    failures = []
    for name in queue_names:
        registry = FailedJobRegistry(name, connection=redis, serializer=JSONSerializer)
        # Scores are failure time plus one TTL, so the highest are the newest.
        for job_id in registry.get_job_ids(0, limit - 1, desc=True, cleanup=False):
            failures.append(_failure(redis, job_id, name, redact))
    failures.sort(key=lambda failure: failure.failed_at or "", reverse=True)
    return failures[:limit]


def _failure(redis: Redis, job_id: str, queue: str, redact: Callable[[str], str]) -> Failure:
    job = _fetch(redis, job_id)
    if job is None:
        return Failure(
            task_id=job_id,
            queue=queue,
            agent_id=None,
            type=None,
            outcome=None,
            error="job data expired or deleted",
            failed_at=None,
        )
    task = _task_of(job)
    report = job.meta.get("report")
    report = report if isinstance(report, dict) else {}
    error = _report_error(report) or _last_line(_rq_error(job))
    return Failure(
        task_id=job_id,
        queue=queue,
        agent_id=_text(report.get("agent_id")) or _text(task.get("agent_id")),
        type=_text(report.get("type")) or _text(task.get("type")),
        outcome=_text(report.get("outcome")),
        error=redact(error) if error else None,
        failed_at=_iso(job.ended_at),
    )


def _report_error(report: dict[str, Any]) -> str | None:
    error = report.get("error")
    if not isinstance(error, dict):
        return None
    return f"{error.get('class', 'Error')}: {error.get('message', '')}"


def _rq_error(job: Job) -> str | None:
    """rq's failure text: the latest failed Result, else the hash's ``exc_info`` field."""
    try:
        result = job.latest_result()
    except (RedisError, ValueError, DeserializationError):
        result = None
    if result is not None and result.type == Result.Type.FAILED and result.exc_string:
        return result.exc_string
    # Failures recorded without running (a job rq cannot load) only have the hash field.
    raw = job.connection.hget(job.key, "exc_info")
    if not isinstance(raw, bytes):
        return None
    try:
        return zlib.decompress(raw).decode("utf-8", "replace")
    except zlib.error:
        return raw.decode("utf-8", "replace")


def _last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


# --- jobs --------------------------------------------------------------------------------------


def _fetch(redis: Redis, job_id: str) -> Job | None:
    """The job, or None when it is gone or unreadable (a zlib bomb too: the capped class)."""
    try:
        return CappedJob.fetch(job_id, connection=redis, serializer=JSONSerializer)
    except (NoSuchJobError, ValueError, DeserializationError):
        return None


def _task_of(job: Job) -> dict[str, Any]:
    """The task object (the job's only argument), or {} when the data cannot be read."""
    try:
        arguments = job.args
    except DeserializationError:
        return {}
    task = arguments[0] if arguments else None
    return task if isinstance(task, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _iso(moment: datetime | None) -> str | None:
    # Milliseconds, always in UTC: these strings sort in time order.
    return moment.astimezone(UTC).isoformat(timespec="milliseconds") if moment else None


# --- the table ---------------------------------------------------------------------------------
