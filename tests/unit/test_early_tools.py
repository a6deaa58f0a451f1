"""A task's tools open while the Hub answers the budget and thread reads, and close on
every path, also when the task ends before its executor runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import fakeredis
import pytest

from hub_client import BudgetHealth, HubUnavailable, Post
from tests.support.definitions import write_agent
from tests.support.pipeline import Harness, notification
from worker.agents import AgentDefinition, AgentStore
from worker.exceptions import ConfigurationError
from worker.jobs import execute_task
from worker.models._scripted import Turn
from worker.task import Outcome, Task
from worker.tools import ScopeCell, Toolbox

pytestmark = pytest.mark.anyio


class ToolboxProbe:
    """An opener that tells when the toolbox started opening, opened and closed."""

    def __init__(self, harness: Harness, *, fail: Exception | None = None) -> None:
        self.harness = harness
        self.fail = fail
        self.opening = anyio.Event()
        self.may_open = anyio.Event()
        self.may_open.set()
        self.opened = False
        self.closed = False

    @asynccontextmanager
    async def open(
        self, agent: AgentDefinition, task: Task, scope: ScopeCell
    ) -> AsyncIterator[Toolbox]:
        self.opening.set()
        try:
            await self.may_open.wait()
            if self.fail is not None:
                raise self.fail
            self.opened = True
            yield self.harness.toolbox
        finally:
            self.closed = True


async def run_with(
    harness: Harness,
    probe: ToolboxProbe,
    task: dict[str, Any],
    *,
    budget_waits: bool = False,
    hub_down_for_threads: bool = False,
) -> Any:
    async with harness.hub() as hub:
        if hub_down_for_threads:

            async def no_thread(post_id: str, **options: Any) -> Post:
                raise HubUnavailable("connection refused", method="GET", path=f"/posts/{post_id}")

            setattr(hub, "get_post", no_thread)  # noqa: B010
        if budget_waits:
            # The budget read answers only once the toolbox is opening: run one after the
            # other, the task would never get past it.
            read_budget = hub.budget_health

            async def budget_after_opening(agent_id: str, **options: Any) -> BudgetHealth:
                with anyio.fail_after(5):
                    await probe.opening.wait()
                return await read_budget(agent_id, **options)

            setattr(hub, "budget_health", budget_after_opening)  # noqa: B010
        runtime = harness.runtime(hub)
        runtime.open_toolbox = probe.open
        return await execute_task(task, runtime)


async def test_the_toolbox_opens_while_the_hub_is_read(redis: fakeredis.FakeRedis) -> None:
    harness = Harness([Turn(text="Scale out with more workers.")], redis=redis)
    post_id = await harness.seed_post()
    probe = ToolboxProbe(harness)

    verdict = await run_with(harness, probe, notification(post_id), budget_waits=True)

    assert verdict.report.outcome is Outcome.COMPLETED, verdict.report.error
    assert probe.opened and probe.closed


async def test_an_unhealthy_budget_closes_the_toolbox_opened_early(
    redis: fakeredis.FakeRedis,
) -> None:
    harness = Harness([Turn(text="never")], redis=redis)
    await harness.dev("budget", {"agent_id": "demo-agent", "healthy": False})
    probe = ToolboxProbe(harness)

    verdict = await run_with(
        harness, probe, {"task_id": "b-1", "type": "exploration", "agent_id": "demo-agent"}
    )

    assert verdict.report.outcome is Outcome.BUDGET_UNHEALTHY
    assert harness.model.requests == []
    assert probe.closed


async def test_a_requeued_task_closes_the_toolbox_opened_early(redis: fakeredis.FakeRedis) -> None:
    harness = Harness([Turn(text="never")], redis=redis)
    post_id = await harness.seed_post()
    probe = ToolboxProbe(harness)

    verdict = await run_with(harness, probe, notification(post_id), hub_down_for_threads=True)

    assert verdict.report.outcome is Outcome.REQUEUED
    assert verdict.requeue is not None
    assert probe.closed


async def test_a_task_that_ends_first_cancels_a_toolbox_still_opening(
    redis: fakeredis.FakeRedis,
) -> None:
    harness = Harness([Turn(text="never")], redis=redis)
    await harness.dev("budget", {"agent_id": "demo-agent", "healthy": False})
    probe = ToolboxProbe(harness)
    probe.may_open = anyio.Event()  # the servers never answer

    with anyio.fail_after(5):
        verdict = await run_with(
            harness, probe, {"task_id": "b-2", "type": "exploration", "agent_id": "demo-agent"}
        )

    assert verdict.report.outcome is Outcome.BUDGET_UNHEALTHY
    assert probe.opening.is_set() and probe.closed and not probe.opened


async def test_a_toolbox_that_fails_to_open_fails_the_task_as_the_executor_would(
    redis: fakeredis.FakeRedis,
) -> None:
    harness = Harness([Turn(text="never")], redis=redis)
    post_id = await harness.seed_post()
    probe = ToolboxProbe(harness, fail=ConfigurationError("MCP_CONFIG: server 'kit' is broken"))

    verdict = await run_with(harness, probe, notification(post_id))

    assert verdict.report.outcome is Outcome.ERROR
    assert verdict.report.error.message == "MCP_CONFIG: server 'kit' is broken"  # type: ignore[union-attr]
    assert harness.model.requests == []


async def test_a_cli_agent_never_opens_the_workers_toolbox(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    write_agent(
        tmp_path,
        "cli-agent",
        "name: cli-agent\ntype: claude-code\n"
        "brain: {provider: anthropic, model: claude-sonnet-4-5}\n"
        "behavior: {discovery: {enabled: true}}\n",
    )
    harness = Harness([], redis=redis)
    probe = ToolboxProbe(harness)
    async with harness.hub() as hub:
        runtime = harness.runtime(hub)
        runtime.agents = AgentStore(str(tmp_path), redis=harness.redis)
        runtime.open_toolbox = probe.open
        verdict = await execute_task(
            {"task_id": "c-1", "type": "exploration", "agent_id": "cli-agent"}, runtime
        )

    assert verdict.report.outcome is not Outcome.COMPLETED  # no claude binary here
    assert not probe.opening.is_set()
