"""Process groups a job starts outside its own (trap 8), killed once the job process exits.

Stdio MCP servers and CLI executors run in their own session, so rq's
``killpg`` of the job process misses them. The job records each one with
``register_child_process``; the worker parent kills what is left after the job.

Records are kept per run of the job: rq's execution, which the worker names for the
code inside ``recording_children_of``. rq may start the same job id again (an
immediate retry) in another job thread or worker while the first run's after-job
steps still run: that clean-up must take only the first run's processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from redis import Redis

from worker._spawn import SpawnHook
from worker.logs import log_event
from worker.redis_io import keys as redis_keys

CHILDREN_TTL_S = 7 * 86_400
TERM_GRACE_S = 2.0

# The rq execution running in this thread (a forked job process has one, a job thread its own).
_EXECUTION: ContextVar[str | None] = ContextVar("recording_children_of", default=None)


@contextmanager
def recording_children_of(execution_id: str) -> Iterator[None]:
    """Inside: ``register_child_process`` records under this run (rq execution) of the job."""
    token = _EXECUTION.set(execution_id)
    try:
        yield
    finally:
        _EXECUTION.reset(token)


def register_child_process(redis: Redis, job_id: str, pid: int) -> None:
    """Record a process (group leader) the job started, to be killed if it outlives the job.

    The process start time is stored with the pid, so a pid the system reused
    for an unrelated process is never killed.
    """
    _record(redis, job_id, _EXECUTION.get(), pid)


def child_process_recorder(redis: Redis, job_id: str) -> SpawnHook:
    """``register_child_process`` for the run calling this now, for an ``on_spawn`` hook
    that may fire on another thread (a pooled server starts on the pool's)."""
    execution_id = _EXECUTION.get()
    return lambda pid: _record(redis, job_id, execution_id, pid)


def _record(redis: Redis, job_id: str, execution_id: str | None, pid: int) -> None:
    started = _start_ticks(pid)
    key = redis_keys.job_children(job_id, execution_id)
    with redis.pipeline(transaction=True) as pipe:
        pipe.sadd(key, f"{pid}:{started}" if started is not None else str(pid))
        pipe.expire(key, CHILDREN_TTL_S)
        pipe.execute()


def kill_recorded_process_groups(
    redis: Redis, job_id: str, execution_id: str | None = None
) -> list[int]:
    """Kill every recorded process group of a finished run that still runs; returns their pids.

    ``execution_id`` names the run (as ``recording_children_of`` did); None: the job's
    records made outside an rq execution.
    """
    key = redis_keys.job_children(job_id, execution_id)
    with redis.pipeline(transaction=True) as pipe:
        pipe.smembers(key)
        pipe.delete(key)
        members, _ = pipe.execute()
    alive = [pid for pid in (_recorded_pid(member) for member in members) if pid is not None]
    if not alive:
        return []
    for pid in alive:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and any(_exists(pid) for pid in alive):
        time.sleep(0.05)
    for pid in alive:
        if _exists(pid):
            _signal_group(pid, signal.SIGKILL)
        _reap(pid)
    log_event("child_processes_killed", job_id=job_id, execution=execution_id, pids=alive)
    return alive


def _recorded_pid(member: bytes | str) -> int | None:
    """The pid of a record if that very process still runs and is safe to kill."""
    text = member.decode() if isinstance(member, bytes) else member
    pid_text, _, started_text = text.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return None
    # Never our own group, init, or anything outside the pid range of real processes.
    if pid <= 1 or pid in (os.getpid(), os.getpgrp()) or not _exists(pid):
        return None
    if started_text and str(_start_ticks(pid)) != started_text:
        return None
    return pid


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        # Not a group leader after all: signal the process itself.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        log_event("child_process_kill_refused", level="warning", pid=pid)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _state(pid) != "Z"


def _reap(pid: int) -> None:
    # Only our own children can be reaped (when the worker is PID 1 in a container).
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ")".
    return text[text.rfind(")") + 2 :].split()


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    # Field 22 of /proc/<pid>/stat (starttime) is the 20th after the command name.
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])
