"""hub-agent-worker: runs LLM agents for the Hub from rq tasks.

Operators start ``rq worker agents`` with ``RQ_WORKER_CLASS=worker.AgentWorker``;
Python Hubs enqueue with ``enqueue_task`` (the same atomic script as the CLI).

The folders are layers, each importing only those below it (docs/development.md draws
them; tests/unit/test_layers.py holds the order), from the top:

    daemon/ (pool/), operations/, jobs, rq_config, enqueue
                      the processes: AgentWorker, ``agent-worker pool``, ``agent-worker``
    pipeline/ executors/
                      one task, stage by stage; the coding-agent CLIs and their gateway
    coordination/ memory/ hub_writes/ metrics/
                      what a task shares: leases, control, checkpoints; memory; the
                      outbox and write caps; Prometheus
    loop/             the agent run: reason, tool, observe, within its limits
    redis_io/ agents/ models/ tools/ tracing/
                      Redis plumbing and capped jobs, definitions, models, tools, traces
    settings, exceptions, task, logs, redaction, _network, _spawn, _tokens, ...
                      what every part uses

The names below load on first use (``worker._lazy``): this file runs before any module
of the worker, so it must not pay for rq, Redis, prometheus and the Hub client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.daemon import AgentWorker as AgentWorker
    from worker.enqueue import EnqueueResult as EnqueueResult
    from worker.enqueue import enqueue_task as enqueue_task


__getattr__ = lazy_getattr(__name__)
