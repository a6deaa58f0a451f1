"""hub-agent-worker: runs LLM agents for the Hub from rq tasks.

Operators start ``rq worker agents`` with ``RQ_WORKER_CLASS=worker.AgentWorker``;
Python Hubs enqueue with ``enqueue_task`` (the same atomic script as the CLI).

The names below load on first use, so that importing a light part of the worker
(``worker.loop``, ``worker.tools``) does not pay for rq, Redis, prometheus and the
Hub client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.checks import CheckReport, run_checks
    from worker.daemon import AgentWorker, register_child_process
    from worker.enqueue import EnqueueResult, enqueue_task

_LAZY = {
    "AgentWorker": "worker.daemon",
    "CheckReport": "worker.checks",
    "EnqueueResult": "worker.enqueue",
    "enqueue_task": "worker.enqueue",
    "register_child_process": "worker.daemon",
    "run_checks": "worker.checks",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "AgentWorker",
    "CheckReport",
    "EnqueueResult",
    "enqueue_task",
    "register_child_process",
    "run_checks",
]
