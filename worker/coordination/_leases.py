"""Leases in Redis: one copy of a task at a time, and at most N tasks of an agent at once.

Both expire on their own (a crashed holder cannot block forever), are renewed
in the background while their task runs (every third of their TTL, so a task
that outlives the TTL keeps them), and are released explicitly when it ends.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError
from rq.job import Job
from rq.registry import StartedJobRegistry

from worker._signals import signals_left_to_the_main_thread
from worker.coordination._runs import current_run
from worker.logs import log_event
from worker.redis_io import keys as redis_keys

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
# Take over a lease from an in-process run that rq's started registry (KEYS[2]) no longer
# holds as running (ARGV[4], expiry score after ARGV[5] = now): its worker died, its
# heartbeats stopped, and rq called it abandoned. Only if that run still holds the lease.
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local expires = redis.call('ZSCORE', KEYS[2], ARGV[4])
if expires and tonumber(expires) > tonumber(ARGV[5]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
# Extend a lease we hold, take it back if it lapsed unclaimed; 0 when another holds it.
_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


class Renewal:
    """A daemon thread calling ``renew`` every ``interval_s`` until stopped or refused.

    ``renew`` returns False when the claim is lost (someone else holds it): the
    thread stops. A Redis error is logged and tried again at the next interval.
    """

    def __init__(self, what: str, renew: Callable[[], bool], *, interval_s: float) -> None:
        self._what = what
        self._renew = renew
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._run, name=f"renew {what}", daemon=True)
        with signals_left_to_the_main_thread():
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                held = self._renew()
            except RedisError as exc:
                log_event("lease_renewal_failed", "warning", lease=self._what, error=str(exc))
                continue
            if not held:
                self.lost = True
                log_event("lease_lost", "warning", lease=self._what)
                return


def lease_holder(pid: int, run_id: str | None = None) -> str:
    """How a lease names the run holding it: ``host:pid`` for a forked job process,
    ``host:pid/run_id`` for one of the task runs of a concurrent worker process."""
    holder = f"{socket.gethostname()}:{pid}"
    return holder if run_id is None else f"{holder}/{run_id}"


def run_of_holder(holder: str) -> str | None:
    """The run id of an in-process run's holder name (``host:pid/run_id``), else None."""
    _, separator, run_id = holder.rpartition(":")[2].partition("/")
    return run_id if separator and run_id else None


def current_lease_holder() -> str:
    """The holder name of the task run calling it (its process, and its run when in-process)."""
    return lease_holder(os.getpid(), current_run())


def release_lease_of(redis: Redis, task_id: str, pid: int, run_id: str | None = None) -> bool:
    """Free the task's lease if process ``pid`` of this host (run ``run_id`` in it, for an
    in-process run) holds it; True if it did.

    For the worker once it knows the run is dead (its job process killed, or taken
    down by a cold shutdown): the re-run then starts at once instead of waiting
    for the lease to expire.
    """
    holder = lease_holder(pid, run_id)
    return bool(redis.eval(_RELEASE, 1, redis_keys.task_lease(task_id), holder))


class TaskLease:
    """Held by the one process running a task; a re-enqueued copy waits for it.

    Once acquired it is renewed in the background (``renew=True``) until released,
    so it never lapses under a task that runs longer than its TTL.
    """

    def __init__(
        self, redis: Redis, task_id: str, *, holder: str, ttl_s: float, renew: bool = True
    ) -> None:
        self._redis = redis
        self._task_id = task_id
        self._key = redis_keys.task_lease(task_id)
        self._holder = holder
        self._ttl_ms = max(1000, int(ttl_s * 1000))
        self._renew = renew
        self._renewal: Renewal | None = None

    def acquire(self) -> bool:
        taken = bool(self._redis.set(self._key, self._holder, nx=True, px=self._ttl_ms))
        if not taken:
            taken = self._take_over_from_dead_run()
        if taken and self._renew and self._renewal is None:
            self._renewal = Renewal(
                f"task {self._task_id}", self.renew, interval_s=self._ttl_ms / 3000
            )
        return taken

    def _take_over_from_dead_run(self) -> bool:
        """Take the lease of a run in a concurrent worker that died with it (SIGKILL, OOM).

        No process is left to release it, and it would outlive the task's deadline. Such
        a run is alive exactly as long as rq holds its execution as running (its worker's
        heartbeats keep it in the started registry): once rq called it abandoned (and
        re-enqueued the task), the lease is free too. A forked job process (``host:pid``)
        releases its own lease or lets it lapse.
        """
        holder = self.holder()
        run_id = run_of_holder(holder) if holder else None
        origin = self._redis.hget(Job.key_for(self._task_id), "origin") if run_id else None
        if holder is None or run_id is None or origin is None:
            return False
        queue_name = origin.decode() if isinstance(origin, bytes) else str(origin)
        started = StartedJobRegistry(queue_name, connection=self._redis).key
        execution = f"{self._task_id}:{run_id}"  # how rq names an execution in the registry
        taken = bool(
            self._redis.eval(
                _TAKE_OVER,
                2,
                self._key,
                started,
                holder,
                self._holder,
                self._ttl_ms,
                execution,
                time.time(),
            )
        )
        if taken:
            log_event("task_lease_taken_over", "warning", task=self._task_id, dead_holder=holder)
        return taken

    def renew(self) -> bool:
        """Extend the lease (or take it back if it lapsed); False when another copy holds it."""
        return bool(self._redis.eval(_RENEW, 1, self._key, self._holder, self._ttl_ms))

    def holder(self) -> str | None:
        value = self._redis.get(self._key)
        return value.decode() if isinstance(value, bytes) else None

    def release(self) -> None:
        if self._renewal is not None:
            self._renewal.stop()
            self._renewal = None
        self._redis.eval(_RELEASE, 1, self._key, self._holder)


class AgentSlots:
    """``behavior.max_concurrent`` across the fleet: a slot per running task of the agent."""

    def __init__(
        self, redis: Redis, agent_id: str, *, limit: int, ttl_s: float, renew: bool = True
    ) -> None:
        self._redis = redis
        self._key = redis_keys.agent_running(agent_id)
        self._limit = limit
        self._ttl_s = ttl_s
        self._renew = renew
        self._renewals: dict[str, Renewal] = {}

    def take(self, task_id: str) -> bool:
        taken = self._take(task_id)
        if taken and self._renew and task_id not in self._renewals:
            self._renewals[task_id] = Renewal(
                f"slot of {task_id}", lambda: self.renew(task_id), interval_s=self._ttl_s / 3
            )
        return taken

    def renew(self, task_id: str) -> bool:
        """Push the slot's expiry forward (re-adding it if it was dropped); always ours."""
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._key, {task_id: time.time() + self._ttl_s})
            pipe.pexpire(self._key, int(self._ttl_s * 1000) + 60_000)
            pipe.execute()
        return True

    def _take(self, task_id: str) -> bool:
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
        renewal = self._renewals.pop(task_id, None)
        if renewal is not None:
            renewal.stop()
        self._redis.zrem(self._key, task_id)

    def running(self) -> list[str]:
        members = self._redis.zrangebyscore(self._key, time.time(), "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]
