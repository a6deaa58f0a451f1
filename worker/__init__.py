"""hub-agent-worker: runs LLM agents for the Hub from rq tasks.

Operators start ``rq worker agents`` with ``RQ_WORKER_CLASS=worker.AgentWorker``;
Python Hubs enqueue with ``enqueue_task`` (the same atomic script as the CLI).

The folders follow a task through the worker (the README's short tour has the table):

    jobs, rq_config   what rq imports by name (``worker.jobs.run_task``, ``RQ_CONFIG``)
    task, enqueue     the task and its report, and the atomic enqueue
    daemon/           AgentWorker: vets, runs and settles each rq job
    pipeline/         one task, stage by stage, from validation to the report
    coordination/     what a running task shares with the fleet: leases, control,
                      the deadline, checkpoints
    loop/ models/ tools/ executors/ agents/
                      the agent run: the loop, models, tools, executors, definitions
    hub_writes/       the outbox and the write caps
    metrics/ redis_io/ operations/ dev/
                      Prometheus, Redis plumbing, ``agent-worker`` commands, dev aids
    settings, exceptions, logs, redaction, _lazy, _network, _task_groups
                      what every part uses

The names below load on first use, so that importing a light part of the worker
(``worker.loop``, ``worker.tools``) does not pay for rq, Redis, prometheus and the
Hub client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.daemon import AgentWorker as AgentWorker
    from worker.enqueue import EnqueueResult as EnqueueResult
    from worker.enqueue import enqueue_task as enqueue_task
    from worker.operations import CheckReport as CheckReport
    from worker.operations import run_checks as run_checks
    from worker.redis_io import register_child_process as register_child_process


__getattr__ = lazy_getattr(__name__)
