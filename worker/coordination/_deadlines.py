"""One absolute deadline per task, fixed at its first start and kept in Redis.

A task may run several times: a crash re-run resumes from its checkpoint, a
provider outage puts it back with a delay. Each run continues against the
deadline the first run fixed (epoch seconds, shared by every worker host), so a
task never gets a fresh wall-clock budget by failing. The key is dropped when
the task ends for good; it expires on its own long after the deadline in case
nobody gets to drop it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis

from worker.redis_io import keys as redis_keys

# How long the key outlives the deadline: a crash re-run rq starts late (maintenance,
# a worker restarted the next morning) must still find it and end as `deadline`.
DEADLINE_KEY_SLACK_S = 86_400


@dataclass(slots=True, kw_only=True, frozen=True)
class TaskDeadline:
    """When the task must be over, as epoch seconds (``time.time()`` scale)."""

    epoch_s: float
    # False on a re-run: the deadline was fixed by an earlier run of the task.
    first_start: bool = True

    def remaining_s(self, now: float | None = None) -> float:
        return self.epoch_s - (time.time() if now is None else now)

    def timeout_s(self, cap_s: float, *, floor_s: float = 0.001) -> float:
        """A call's timeout: the remaining time, capped by the call's own default."""
        return max(floor_s, min(self.remaining_s(), cap_s))

    def passed_by(self, delay_s: float) -> bool:
        """Would something starting ``delay_s`` from now begin at or after the deadline?"""
        return delay_s >= self.remaining_s()


def fix_task_deadline(
    redis: Redis,
    task_id: str,
    duration_s: float,
    *,
    clock: Callable[[], float] = time.time,
) -> TaskDeadline:
    """The task's deadline: fixed now (``duration_s`` from now) unless an earlier run fixed it.

    A stored deadline is only ever tightened, by a definition or constraint that
    shrank since the first run; it is never extended.
    """
    now = clock()
    key = redis_keys.task_deadline(task_id)
    candidate = now + duration_s
    ttl_s = max(1, int(duration_s + DEADLINE_KEY_SLACK_S))
    if redis.set(key, repr(candidate), nx=True, ex=ttl_s):
        return TaskDeadline(epoch_s=candidate, first_start=True)
    stored = _parse(redis.get(key))
    if stored is None:  # damaged: the safest reading is "from now", never "forever"
        redis.set(key, repr(candidate), ex=ttl_s)
        return TaskDeadline(epoch_s=candidate, first_start=True)
    return TaskDeadline(epoch_s=min(stored, candidate), first_start=False)


def read_task_deadline(redis: Redis, task_id: str) -> float | None:
    """The deadline a run of the task fixed, or None before its first start."""
    return _parse(redis.get(redis_keys.task_deadline(task_id)))


def forget_task_deadline(redis: Redis, task_id: str) -> None:
    """The task ended for good: a later task with the same id starts afresh."""
    redis.delete(redis_keys.task_deadline(task_id))


def _parse(raw: object) -> float | None:
    if not isinstance(raw, bytes | str):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
