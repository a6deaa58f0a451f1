"""What one job thread of a concurrent worker carries: its run, and its own timeout.

A thread cannot be killed, so what rq does to a job process is done to a run:
    stop-job          the task is cancelled at its next step and ends STOPPED in rq
    handed back       (cold shutdown, or stuck past its timeout) the run is revoked: its
                      thread may run on, but every write it would make to rq or the Hub
                      is fenced off (``fence_revoked_run``), so only the next run settles
    past its timeout  rq's timer raises in the thread; JOB_TIMEOUT_GRACE_S later the task
                      is cancelled; as long again later it is handed back and the worker
                      stops taking work and exits (status 1) for its supervisor to restart
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Flag, auto
from typing import Any

from redis import Redis
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import BaseDeathPenalty, JobTimeoutException, TimerDeathPenalty

from worker.redis_io import share_between_threads

# Redis connections a task may hold at once (its job thread, its task-lease renewal, its
# agent-slot renewal), and those of the worker itself (main thread, heartbeats, rq's
# pubsub, metrics, outbox).
_CONNECTIONS_PER_TASK = 3
_WORKER_CONNECTIONS = 16


class RunStop(Flag):
    """What was asked of a run in a job thread to stop it (a thread cannot be killed)."""

    NONE = 0
    ASKED = auto()  # rq's stop-job or stop-execution: cancelled, its job ends STOPPED
    OVERRAN = auto()  # JOB_TIMEOUT_GRACE_S past rq's timeout: its task cancelled


@dataclass(eq=False)
class InFlightJob:
    """A job handed to a job thread; its execution id names the run (and its task lease)."""

    job: Job
    queue: Queue
    execution: Execution
    started: float = field(default_factory=time.monotonic)
    # Held while the run settles its job with rq, so a hand-back never races it.
    settling: threading.Lock = field(default_factory=threading.Lock)
    stop: RunStop = RunStop.NONE

    def overrun_s(self) -> float:
        """How far past rq's timeout the run is (negative before it; 0 without a timeout)."""
        timeout = self.job.timeout
        if not isinstance(timeout, int) or timeout <= 0:
            return 0.0
        return time.monotonic() - self.started - timeout


class JobThreadDeathPenalty(TimerDeathPenalty):
    """rq's timer penalty for one job thread, naming that job's own timeout.

    rq's ``TimerDeathPenalty`` writes its message into the exception class itself, for
    every thread of the process: the last job started would name its timeout in every
    other job's timeout. Each penalty here raises its own subclass instead.
    """

    def __init__(
        self, timeout: int, exception: type[BaseException] = JobTimeoutException, **kwargs: Any
    ) -> None:
        message = f"Task exceeded maximum timeout value ({timeout} seconds)"

        def init_with_message(self: BaseException, *args: Any, **kwargs: Any) -> None:
            BaseException.__init__(self, message)

        own_exception = type(
            exception.__name__,
            (exception,),
            {"__init__": init_with_message, "__module__": exception.__module__},
        )
        BaseDeathPenalty.__init__(self, timeout, own_exception, **kwargs)  # type: ignore[no-untyped-call]
        self._target_thread_id = threading.current_thread().ident
        self._timer = None


def outcome_of(return_value: Any) -> str | None:
    """The outcome of the report run_task returned (None for any other job's value)."""
    if isinstance(return_value, dict):
        outcome = return_value.get("outcome")
        return outcome if isinstance(outcome, str) else None
    return None


def size_connection_pool(connection: Redis, concurrency: int) -> None:
    """Let every thread that may hold a Redis connection have one, and more wait.

    redis-py's plain pool refuses a connection past ``max_connections`` (100 by default)
    with "Too many connections": 500 tasks in one process failed a fifth of their runs so.
    """
    needed = concurrency * _CONNECTIONS_PER_TASK + _WORKER_CONNECTIONS
    share_between_threads(connection, max_connections=needed)
