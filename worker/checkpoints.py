"""Step checkpoints in Redis: the loop's journal, append-only, one list per task.

A step costs one RPUSH however long the task has run. A task re-run after a
crash or a requeue replays the list and goes on from where it stopped; the
list is deleted when the task ends for good.
"""

from __future__ import annotations

from redis import Redis

from worker import redis_keys
from worker.logs import log_event
from worker.loop import JournalEntry, entry_from_json, entry_to_json

# Long enough to cover every requeue delay; a finished task deletes its list at once.
CHECKPOINT_TTL_S = 3 * 24 * 3600


class RedisJournal:
    def __init__(self, redis: Redis, task_id: str, *, ttl_s: int = CHECKPOINT_TTL_S) -> None:
        self._redis = redis
        self._key = redis_keys.checkpoint(task_id)
        self._ttl_s = ttl_s
        self._task_id = task_id

    def append(self, entry: JournalEntry) -> None:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.rpush(self._key, entry_to_json(entry))
            pipe.expire(self._key, self._ttl_s)
            pipe.execute()

    def load(self) -> list[JournalEntry]:
        """The entries so far; a corrupt tail is cut off and logged, never fatal."""
        entries: list[JournalEntry] = []
        for position, raw in enumerate(self._redis.lrange(self._key, 0, -1)):
            try:
                entries.append(entry_from_json(raw))
            except (ValueError, KeyError, TypeError) as exc:
                log_event(
                    "checkpoint_corrupt",
                    "warning",
                    task=self._task_id,
                    position=position,
                    error=str(exc),
                )
                break
        return entries

    def clear(self) -> None:
        self._redis.delete(self._key)
