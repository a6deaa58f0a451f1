"""AgentWorker variants the benchmarks compare with the stock one (select with RQ_WORKER_CLASS).

- ``PhaseTimedWorker``: the stock worker plus ``bench_phase`` events timing each
  phase of a job (fork, agent load, Hub requests, MCP toolbox open and close).
- ``InProcessAgentWorker``: runs each job in the worker process, as rq's SimpleWorker.
- ``PhaseTimedInProcessWorker``: the phase timers on the in-process variant.
- ``NoPreloadWorker``: the stock worker without its preloading before the fork.

This module imports nothing heavy at the top, so that ``NoPreloadWorker``'s parent
really stays without the job modules.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rq.job import Job
from rq.queue import Queue

from worker import AgentWorker
from worker.logs import log_event


def log_phase(phase: str, started: float, **fields: Any) -> None:
    """One ``bench_phase`` event: ``started`` is a ``time.perf_counter()`` reading."""
    log_event(
        "bench_phase",
        phase=phase,
        task=os.environ.get("RQ_JOB_ID", ""),
        duration_ms=(time.perf_counter() - started) * 1000,
        at=time.time(),
        **fields,
    )


def _install_phase_timers() -> None:
    """Wrap the seams a job goes through in timers; job processes inherit them at fork."""
    import worker.pipeline._run
    import worker.pipeline._runtime
    from hub_client import HubClient
    from worker.agents import AgentDefinition, AgentStore
    from worker.tools import McpConfig, McpToolbox

    class TimedAgentStore(AgentStore):
        def load(self, agent_id: str) -> AgentDefinition:
            started = time.perf_counter()
            try:
                return super().load(agent_id)
            finally:
                log_phase("agent_load", started)

    class TimedHubClient(HubClient):
        async def _send_with_retries(self, method: str, path: str, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await super()._send_with_retries(method, path, **kwargs)
            finally:
                log_phase("hub_call", started, request=f"{method} {path.split('?')[0]}")

    class TimedMcpToolbox(McpToolbox):
        @classmethod
        @asynccontextmanager
        async def open(cls, config: McpConfig, **kwargs: Any) -> AsyncIterator[McpToolbox]:
            started = time.perf_counter()
            async with super().open(config, **kwargs) as toolbox:
                log_phase("mcp_open", started)
                try:
                    yield toolbox
                finally:
                    closing = time.perf_counter()
            log_phase("mcp_close", closing)

    seams = (
        (worker.pipeline._runtime, "AgentStore", TimedAgentStore),
        (worker.pipeline._runtime, "McpToolbox", TimedMcpToolbox),
        (worker.pipeline._run, "HubClient", TimedHubClient),
    )
    for module, name, timed in seams:
        setattr(module, name, timed)


class PhaseTimedWorker(AgentWorker):
    """The stock AgentWorker plus ``bench_phase`` events (see the module docstring)."""

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        _install_phase_timers()
        self._fork_started = 0.0

    def execute_job(self, job: Job, queue: Queue) -> None:
        started = time.perf_counter()
        super().execute_job(job, queue)
        log_phase("parent_job_total", started, job=job.id)

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        # The child reads its copy of this attribute; perf_counter is system-wide.
        self._fork_started = time.perf_counter()
        super().fork_work_horse(job, queue)
        log_phase("parent_fork", self._fork_started, job=job.id)

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        log_phase("fork_to_child", self._fork_started)
        super().main_work_horse(job, queue)

    def monitor_work_horse(self, job: Job, queue: Queue, execution: Any) -> None:
        super().monitor_work_horse(job, queue, execution)
        log_event("bench_phase", phase="child_exited", task=job.id, at=time.time())


class InProcessAgentWorker(AgentWorker):
    """The stock AgentWorker running each job in the worker process, as rq's SimpleWorker does.

    For comparison only: the product's default stays forking (a crashing or leaking
    job cannot take the worker with it).
    """

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        self.perform_job(job, queue, self.execution)  # type: ignore[arg-type]

    def monitor_work_horse(self, job: Job, queue: Queue, execution: Any) -> None:
        # rq's forking parent drops the job's execution here; the job already removed it.
        self.executions.pop(execution.id, None)


class PhaseTimedInProcessWorker(PhaseTimedWorker):
    """The phase timers on a worker running each job in its own process (no fork).

    It logs the fork phases as a fork-free run has them: the job starts where
    the fork would be (0 ms), and "exit" is the return from the job.
    """

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        # The timers name their task from RQ_JOB_ID, which rq sets only in a job process.
        os.environ["RQ_JOB_ID"] = job.id
        log_phase("fork_to_child", time.perf_counter())
        self.perform_job(job, queue, self.execution)  # type: ignore[arg-type]

    def monitor_work_horse(self, job: Job, queue: Queue, execution: Any) -> None:
        self.executions.pop(execution.id, None)
        log_event("bench_phase", phase="child_exited", task=job.id, at=time.time())


class NoPreloadWorker(AgentWorker):
    """The stock AgentWorker without its preloading, to show what preloading buys and costs.

    The parent imports no job module and parses no configuration before it forks:
    it stays small, and every job process imports and parses all of it itself.
    """

    def _import_job_modules(self) -> None:
        return None

    def _preload_configuration(self, providers: frozenset[str]) -> None:
        return None
