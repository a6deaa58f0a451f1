"""Cancel and steer a running task through Redis (``agent-worker cancel`` / ``steer``)."""

from __future__ import annotations

import os

from redis import Redis

from worker.coordination._leases import current_lease_holder
from worker.coordination._runs import LeaseLost, fence_revoked_run, running_in_process
from worker.loop import Control
from worker.redis_io import keys as redis_keys

# Requests outlive a task by this much at most, so a typo'd id leaves nothing behind for long.
CONTROL_TTL_S = 24 * 3600


def request_cancel(redis: Redis, task_id: str) -> None:
    redis.set(redis_keys.cancel_flag(task_id), "1", ex=CONTROL_TTL_S)


def request_steer(redis: Redis, task_id: str, text: str) -> None:
    key = redis_keys.steer_messages(task_id)
    with redis.pipeline() as pipe:
        pipe.rpush(key, text.encode())
        pipe.expire(key, CONTROL_TTL_S)
        pipe.execute()


def clear_control(redis: Redis, task_id: str) -> None:
    redis.delete(redis_keys.cancel_flag(task_id), redis_keys.steer_messages(task_id))


class WorkerLost(BaseException):
    """The worker that started this job process is gone: stop without settling anything.

    A BaseException so that no ``except Exception`` on the way turns it into an
    outcome. The task's checkpoint stays; the copy rq re-runs resumes from it.
    """


class RedisControl:
    """The loop's ControlSource for one task: one round trip per step.

    Also checks, at every step, that the worker parent is still alive (a job
    process orphaned by a killed worker must stop before its re-run starts) and
    that no other copy took the task's lease (``LeaseLost``). A task run in a thread
    of the worker process itself dies with it: it has no parent of its own to watch
    (``watch_parent=None`` decides by that).
    """

    def __init__(
        self,
        redis: Redis,
        task_id: str,
        *,
        watch_parent: bool | None = None,
        lease_holder_name: str | None = None,
    ) -> None:
        self._redis = redis
        self._task_id = task_id
        self._cancel_key = redis_keys.cancel_flag(task_id)
        self._steer_key = redis_keys.steer_messages(task_id)
        self._lease_key = redis_keys.task_lease(task_id)
        # The run of the task holds its lease (worker.pipeline takes it).
        self._holder = lease_holder_name or current_lease_holder()
        if watch_parent is None:
            watch_parent = not running_in_process()
        self._parent = os.getppid() if watch_parent else None

    async def poll(self) -> Control:
        fence_revoked_run()
        if self._parent is not None and os.getppid() != self._parent:
            raise WorkerLost(f"worker process {self._parent} is gone")
        with self._redis.pipeline() as pipe:
            pipe.exists(self._cancel_key)
            pipe.lrange(self._steer_key, 0, -1)
            pipe.delete(self._steer_key)
            pipe.get(self._lease_key)
            cancelled, steering, _, holder = pipe.execute()
        self._check_lease(holder)
        return Control(
            cancelled=bool(cancelled),
            steering=[item.decode("utf-8", "replace") for item in steering],
        )

    def _check_lease(self, holder: bytes | str | None) -> None:
        # A lapsed lease (None) is taken back by the renewal; only another holder stops us.
        if holder is None:
            return
        held_by = holder.decode(errors="replace") if isinstance(holder, bytes) else holder
        if held_by != self._holder:
            raise LeaseLost(
                f"task {self._task_id}: its lease is held by {held_by},"
                f" not by this process ({self._holder})"
            )


def _job_status(redis: Redis, task_id: str) -> str | None:
    status = redis.hget(f"rq:job:{task_id}", "status")
    return status.decode() if isinstance(status, bytes) else None


def cancel_task(redis: Redis, task_id: str) -> str:
    """Cancel a task wherever it is; returns a line saying what happened."""
    status = _job_status(redis, task_id)
    if status in {"queued", "scheduled", "deferred"}:
        from rq.serializers import JSONSerializer

        from worker.redis_io import CappedJob, JobDataTooLarge

        try:
            CappedJob.fetch(task_id, connection=redis, serializer=JSONSerializer).cancel()
        except JobDataTooLarge:
            # Never expanded here either; a worker fails it unread when it comes up.
            request_cancel(redis, task_id)
            return f"{task_id}: its job data is over JOB_DATA_MAX_BYTES; a worker fails it unread"
        return f"{task_id}: removed from the queue (was {status})"
    request_cancel(redis, task_id)
    if status == "started":
        return f"{task_id}: cancel requested; it stops at its next step"
    return f"{task_id}: not running (status {status or 'unknown'}); cancel recorded for 24 h"


def steer_task(redis: Redis, task_id: str, text: str) -> str:
    request_steer(redis, task_id, text)
    status = _job_status(redis, task_id)
    if status == "started":
        return f"{task_id}: message queued; it is added before the next step"
    return f"{task_id}: message queued for when it runs (status {status or 'unknown'})"
