"""Leases in Redis: one copy of a task at a time, and at most N tasks of an agent at once.

Both expire on their own (a crashed holder cannot block forever) and are
released explicitly when the task ends.
"""

from __future__ import annotations

import socket
import time

from redis import Redis

from worker import redis_keys

# Take a slot in the agent's sorted set of running tasks (member = task id, score = expiry):
# drop expired holders, re-enter if already holding, else join only under the limit.
_TAKE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 1
end
return 0
"""
# Release only a lease we hold: a copy that outlived its lease must not free another's.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def lease_holder(pid: int) -> str:
    """How a lease names the process holding it: ``host:pid``."""
    return f"{socket.gethostname()}:{pid}"


def release_lease_of(redis: Redis, task_id: str, pid: int) -> bool:
    """Free the task's lease if process ``pid`` of this host holds it; True if it did.

    For the worker parent once it knows its job process is dead (killed, or taken
    down by a cold shutdown): the re-run then starts at once instead of waiting
    for the lease to expire.
    """
    return bool(redis.eval(_RELEASE, 1, redis_keys.task_lease(task_id), lease_holder(pid)))


class TaskLease:
    """Held by the one process running a task; a re-enqueued copy waits for it."""

    def __init__(self, redis: Redis, task_id: str, *, holder: str, ttl_s: float) -> None:
        self._redis = redis
        self._key = redis_keys.task_lease(task_id)
        self._holder = holder
        self._ttl_ms = max(1000, int(ttl_s * 1000))

    def acquire(self) -> bool:
        return bool(self._redis.set(self._key, self._holder, nx=True, px=self._ttl_ms))

    def holder(self) -> str | None:
        value = self._redis.get(self._key)
        return value.decode() if isinstance(value, bytes) else None

    def release(self) -> None:
        self._redis.eval(_RELEASE, 1, self._key, self._holder)


class AgentSlots:
    """``behavior.max_concurrent`` across the fleet: a slot per running task of the agent."""

    def __init__(self, redis: Redis, agent_id: str, *, limit: int, ttl_s: float) -> None:
        self._redis = redis
        self._key = redis_keys.agent_running(agent_id)
        self._limit = limit
        self._ttl_s = ttl_s

    def take(self, task_id: str) -> bool:
        now = time.time()
        taken = self._redis.eval(
            _TAKE_SLOT,
            1,
            self._key,
            now,
            now + self._ttl_s,
            task_id,
            self._limit,
            int(self._ttl_s * 1000) + 60_000,
        )
        return bool(taken)

    def release(self, task_id: str) -> None:
        self._redis.zrem(self._key, task_id)

    def running(self) -> list[str]:
        members = self._redis.zrangebyscore(self._key, time.time(), "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]
