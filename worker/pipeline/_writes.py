"""A task's Hub writes: kept within its scope, counted against the agent's write caps,
sent through the outbox.

Used by the request (the scoped, capped toolbox), the answer and the settling alike.
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
from worker.logs import log_event
from worker.pipeline._runtime import TaskRuntime, mcp_config
from worker.pipeline._state import RunState
from worker.task import Task
from worker.tools import ScopedToolbox, ScopeRefusal, ScopeRefusalHandler, Toolbox

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


def scope_refusal_handler(runtime: TaskRuntime, state: RunState, task: Task) -> ScopeRefusalHandler:
    """Keeps a write the scope held back for the report, and logs and counts it."""

    def handle(refusal: ScopeRefusal) -> None:
        state.refused_writes.append(refusal)
        if refusal.reason.is_egress:
            runtime.metrics.egress_refused(agent=task.agent_id, tool=refusal.tool)
        else:
            runtime.metrics.scope_refused(agent=task.agent_id, tool=refusal.tool)
        log_event(
            "scope_refused",
            "warning",
            task=task.task_id,
            agent=task.agent_id,
            tool=refusal.tool,
            reason=refusal.reason.value,
            target=runtime.redactor(refusal.target),
        )

    return handle


def scoped_toolbox(
    runtime: TaskRuntime, state: RunState, task: Task, agent: AgentDefinition
) -> AbstractAsyncContextManager[Toolbox]:
    """The agent's tools, its writes kept within the task's scope (checked first: an
    out-of-scope write uses no cap) and counted against its write caps."""
    settings = runtime.settings

    @asynccontextmanager
    async def open_scoped() -> AsyncIterator[Toolbox]:
        async with runtime.open_toolbox(agent, task, state.scope) as toolbox:
            capped = CappedToolbox(
                toolbox,
                write_ledger(runtime, task, agent),
                hub_server=settings.hub_tool_server,
                on_refused=refusal_handler(runtime, task, agent),
            )
            yield ScopedToolbox(
                capped,
                state.scope,
                hub_server=settings.hub_tool_server,
                web_server=settings.web_tool_server,
                mcp_config=mcp_config(settings.mcp_config) if settings.mcp_config else None,
                on_refused=scope_refusal_handler(runtime, state, task),
            )

    return open_scoped()
