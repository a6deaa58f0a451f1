"""The worker daemon: ``AgentWorker`` (what ``rq worker agents`` runs) and its parts.

``AgentWorker`` vets each job before it runs and settles it after; the job runs in
rq's forked job process, or in a thread of the worker process with WORKER_CONCURRENCY
above 1.

The names load on first use, like the ``worker`` face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.daemon._job_timeout import run_timeout_s
    from worker.daemon._worker import AgentWorker

_LAZY = {
    "AgentWorker": "worker.daemon._worker",
    "run_timeout_s": "worker.daemon._job_timeout",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "AgentWorker",
    "run_timeout_s",
]
