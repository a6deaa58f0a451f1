"""Which task run this code belongs to, and whether its worker handed it back.

Light on purpose (no Redis, no rq): the Hub writer and the capped toolbox fence every
write with ``fence_revoked_run``, and the CLI gateway, which loads them, must not pay for
the lease machinery.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Set while a task runs in a job thread of a worker process that runs several at once
# (WORKER_CONCURRENCY above 1): there the pid alone does not tell one run from another.
_IN_PROCESS_RUN: ContextVar[str | None] = ContextVar("in_process_run", default=None)


@contextmanager
def in_process_run(run_id: str) -> Iterator[None]:
    """Run the code inside as one of several task runs of this process, named ``run_id``.

    For the job threads of a concurrent worker: the lease holder names the run, and
    the task does not watch for a dead worker parent (it has none of its own).
    """
    token = _IN_PROCESS_RUN.set(run_id)
    try:
        yield
    finally:
        _IN_PROCESS_RUN.reset(token)


def current_run() -> str | None:
    """The name of the in-process run calling, or None in a forked job process."""
    return _IN_PROCESS_RUN.get()


def running_in_process() -> bool:
    """True inside ``in_process_run``: the task shares its process with the worker."""
    return _IN_PROCESS_RUN.get() is not None


# In-process runs the worker handed back (a cold shutdown, a run stuck past its timeout):
# their task belongs to the next run now, so their thread must write nothing more. A set
# only ever added to (one entry per run handed back, in a process about to exit).
_REVOKED_RUNS: set[str] = set()


def revoke_in_process_run(run_id: str) -> None:
    """From now on the run named ``run_id`` may write nothing (``run_is_revoked``)."""
    _REVOKED_RUNS.add(run_id)


def run_is_revoked(run_id: str | None = None) -> bool:
    """True when the in-process run (``run_id``, else the caller's own) was handed back."""
    run_id = run_id if run_id is not None else _IN_PROCESS_RUN.get()
    return run_id is not None and run_id in _REVOKED_RUNS


class LeaseLost(BaseException):
    """Another copy of this task holds its lease now: stop without settling anything.

    A BaseException for the same reason as ``WorkerLost``; the worker leaves the
    rq job to the copy that holds the lease.
    """


def fence_revoked_run() -> None:
    """Raise ``LeaseLost`` in a run its worker handed back; call before a write of the task.

    Such a run's task was put back for another run (a cold shutdown, a run stuck past its
    timeout), but its thread cannot be killed: every write to rq or the Hub checks here.
    """
    if run_is_revoked():
        raise LeaseLost("this run was handed back by its worker; the task belongs to the next run")
