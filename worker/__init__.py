"""hub-agent-worker: runs LLM agents for the Hub from rq tasks.

Operators start ``rq worker agents`` with ``RQ_WORKER_CLASS=worker.AgentWorker``;
Python Hubs enqueue with ``enqueue_task`` (the same atomic script as the CLI).
"""

from worker._worker import AgentWorker, register_child_process
from worker.checks import CheckReport, run_checks
from worker.enqueue import EnqueueResult, enqueue_task

__all__ = [
    "AgentWorker",
    "CheckReport",
    "EnqueueResult",
    "enqueue_task",
    "register_child_process",
    "run_checks",
]
