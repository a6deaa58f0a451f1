"""A task's Hub writes: counted against the agent's write caps, sent through the outbox.

Used by the request (the capped toolbox), the answer and the settling alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from hub_client import HubClient
from worker.agents import AgentDefinition
from worker.hub_writes import (
    CappedToolbox,
    HubWriter,
    RefusalHandler,
    WriteCaps,
    WriteLedger,
    counted_refusals,
)
from worker.pipeline._runtime import TaskRuntime
from worker.task import Task
from worker.tools import Toolbox

# Of rq's grace after the deadline (JOB_TIMEOUT_GRACE_S): what the Hub writes of settling may
# take, so rq never kills a settling task.
SETTLE_SHARE_OF_GRACE = 0.5


def hub_writer(runtime: TaskRuntime, hub: HubClient, task_id: str) -> HubWriter:
    """The one path of a task's Hub writes: sent, parked or dead-lettered, never raised."""
    return HubWriter(
        hub,
        runtime.redis,
        task_id=task_id,
        max_attempts=runtime.settings.outbox_max_attempts,
        on_dead_letter=runtime.metrics.dead_letter,
        timeout_s=runtime.settings.hub_timeout_s,
        # Settling may start at the deadline: it must end well within rq's grace.
        budget_s=runtime.settings.job_timeout_grace_s * SETTLE_SHARE_OF_GRACE,
    )


def write_ledger(runtime: TaskRuntime, task: Task, agent: AgentDefinition) -> WriteLedger:
    """The agent's write caps and what it has written, for this task."""
    caps = WriteCaps.of(agent, max_writes_per_post=runtime.settings.max_writes_per_post)
    return WriteLedger(runtime.redis, agent_id=agent.config.name, task_id=task.task_id, caps=caps)


def refusal_handler(runtime: TaskRuntime, task: Task, agent: AgentDefinition) -> RefusalHandler:
    """Counts and logs a write the caps held back."""
    return counted_refusals(
        agent_id=agent.config.name, task_id=task.task_id, metrics=runtime.metrics
    )


def capped_toolbox(
    runtime: TaskRuntime, task: Task, agent: AgentDefinition
) -> AbstractAsyncContextManager[Toolbox]:
    """The agent's tools, its Hub writes counted against its write caps."""

    @asynccontextmanager
    async def open_capped() -> AsyncIterator[Toolbox]:
        async with runtime.open_toolbox(agent, task) as toolbox:
            yield CappedToolbox(
                toolbox,
                write_ledger(runtime, task, agent),
                hub_server=runtime.settings.hub_tool_server,
                on_refused=refusal_handler(runtime, task, agent),
            )

    return open_capped()
