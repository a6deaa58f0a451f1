"""Finding a task's rq job by the id an operator typed, for the commands that take one.

Every command says what went wrong in the same words: a malformed id, an unknown (or
expired) task, a job hash that cannot be read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from redis import Redis
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer

from worker.enqueue import REQUEUE_REASON
from worker.task import TASK_ID_PATTERN

NOT_A_TASK_ID = "not a task id (1-128 characters of A-Z, a-z, 0-9, '_' and '-')"
UNKNOWN_TASK = "unknown task (no job with this id; it may have expired)"


def fetch_task_job(redis: Redis, task_id: str, *, job_class: type[Job] = Job) -> Job | str:
    """The rq job of ``task_id``, or one line (starting with the id) saying why there is none.

    ``job_class`` loads the hash (``CappedJob`` refuses data that expands beyond its cap:
    that too is data that cannot be read).
    """
    if not re.fullmatch(TASK_ID_PATTERN, task_id):
        return f"{task_id!r}: {NOT_A_TASK_ID}"
    try:
        return job_class.fetch(task_id, connection=redis, serializer=JSONSerializer)
    except NoSuchJobError:
        return f"{task_id}: {UNKNOWN_TASK}"
    except (ValueError, DeserializationError):
        return f"{task_id}: its job data cannot be read"


@dataclass(frozen=True, kw_only=True)
class RequeueNote:
    """Why the worker put a task back, and when it runs next (None once it is due)."""

    attempt: int
    reason: str
    next_try_at: str | None


def requeue_note(redis: Redis, job: Job) -> RequeueNote | None:
    """The note of a task waiting after a requeue; None for any other job."""
    reason = job.meta.get(REQUEUE_REASON) if isinstance(job.meta, dict) else None
    if not isinstance(reason, str):
        return None
    attempt = job.meta.get("attempt")
    score = redis.zscore(ScheduledJobRegistry.key_template.format(job.origin), job.id)
    next_try_at = (
        datetime.fromtimestamp(score, UTC).isoformat(timespec="seconds")
        if score is not None
        else None
    )
    return RequeueNote(
        attempt=attempt if isinstance(attempt, int) else 0, reason=reason, next_try_at=next_try_at
    )
