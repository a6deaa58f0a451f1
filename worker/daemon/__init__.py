"""The worker daemon: ``AgentWorker`` (what ``rq worker agents`` runs) and its parts.

``AgentWorker`` vets each job before it runs and settles it after; the job runs in
rq's forked job process, or in a thread of the worker process with WORKER_CONCURRENCY
above 1. ``CappedJob`` is how every command loads an rq job (its data capped), and
``register_child_process`` how a job records the process groups it starts outside its own.

The names load on first use, like the ``worker`` face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.daemon._children import (
        child_process_recorder,
        kill_recorded_process_groups,
        recording_children_of,
        register_child_process,
    )
    from worker.daemon._job_timeout import run_timeout_s
    from worker.daemon._vetting import CappedJob, JobDataTooLarge, job_attempt
    from worker.daemon._worker import AgentWorker

_LAZY = {
    "AgentWorker": "worker.daemon._worker",
    "CappedJob": "worker.daemon._vetting",
    "JobDataTooLarge": "worker.daemon._vetting",
    "job_attempt": "worker.daemon._vetting",
    "child_process_recorder": "worker.daemon._children",
    "kill_recorded_process_groups": "worker.daemon._children",
    "recording_children_of": "worker.daemon._children",
    "register_child_process": "worker.daemon._children",
    "run_timeout_s": "worker.daemon._job_timeout",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "AgentWorker",
    "CappedJob",
    "JobDataTooLarge",
    "child_process_recorder",
    "job_attempt",
    "kill_recorded_process_groups",
    "recording_children_of",
    "register_child_process",
    "run_timeout_s",
]
