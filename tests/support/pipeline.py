"""The job pipeline in this process: ``execute_task`` on the real devhub app over ASGI, fake
Redis, a scripted model and local tools.

``in_process_hub(key)`` is a HubClient on a devhub app in this process; ``task_runtime``
builds the TaskRuntime a test runs its tasks with; ``Harness`` drives the demo agent's tasks
through both (``notification`` is its task).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from redis import Redis
from starlette.applications import Starlette

from hub_client import HubClient
from hub_client.devhub import create_app
from tests.support.definitions import demo_agents
from worker.agents import AgentDefinition, AgentStore
from worker.jobs import TaskRuntime, TaskVerdict, execute_task
from worker.metrics import JobMetrics
from worker.models import Model
from worker.models._scripted import ScriptedModel
from worker.redaction import Redactor
from worker.settings import Settings
from worker.task import Task
from worker.tools import LocalToolbox, ScopeCell, Toolbox
from worker.tools._local import LocalTool

HUB_URL = "http://devhub"
HUB_KEY = "hub-secret-key-0123456789"
# The demo agents with this worker's extensions (limits, post_final), as make demo runs them.
DEMO_AGENTS = demo_agents()


def in_process_hub(api_key: str = HUB_KEY, app: Starlette | None = None) -> HubClient:
    """A HubClient on ``app`` (a new devhub by default) in this process."""
    app = app if app is not None else create_app(api_key=api_key)
    return HubClient(HUB_URL, api_key, transport=httpx2.ASGITransport(app=app))


def task_runtime(
    hub: HubClient,
    redis: Redis,
    model: Model,
    *,
    agents_dir: Path,
    toolbox: Toolbox | None = None,
    api_key: str = HUB_KEY,
    settings: Settings | None = None,
    also_secret: Sequence[str] = (),
    metrics: JobMetrics | None = None,
    attempt: int = 0,
) -> TaskRuntime:
    """What ``execute_task`` needs, on ``hub``: ``model`` for every agent of ``agents_dir``,
    ``toolbox`` (none by default) for every task; the Hub key, and ``also_secret``,
    redacted."""
    local = toolbox if toolbox is not None else LocalToolbox([])

    @asynccontextmanager
    async def open_toolbox(
        agent: AgentDefinition, task: Task, scope: ScopeCell
    ) -> AsyncIterator[Toolbox]:
        yield local

    return TaskRuntime(
        settings=settings or Settings(hub_url=HUB_URL, hub_api_key=api_key),  # type: ignore[arg-type]
        redis=redis,
        agents=AgentStore(str(agents_dir), redis=redis),
        metrics=metrics if metrics is not None else JobMetrics(),
        redactor=Redactor([api_key, *also_secret]),
        make_model=lambda agent: model,
        open_toolbox=open_toolbox,
        attempt=attempt,
        hub=hub,
    )


class Harness:
    """The demo agent's tasks, one devhub across them: seed it, run tasks, read it back."""

    def __init__(
        self, turns: list[Any], tools: list[LocalTool] | None = None, *, redis: Redis
    ) -> None:
        self.redis = redis
        self.app = create_app(api_key=HUB_KEY)
        self.model = ScriptedModel(turns, name="gpt-4o-mini", provider="openai")
        self.toolbox = LocalToolbox(tools or [])
        self.metrics = JobMetrics()
        self.settings = Settings(hub_url=HUB_URL, hub_api_key=HUB_KEY)  # type: ignore[arg-type]

    def hub(self) -> HubClient:
        return in_process_hub(HUB_KEY, self.app)

    def runtime(self, hub: HubClient, *, attempt: int = 0) -> TaskRuntime:
        return task_runtime(
            hub,
            self.redis,
            self.model,
            agents_dir=DEMO_AGENTS,
            toolbox=self.toolbox,
            settings=self.settings,
            metrics=self.metrics,
            attempt=attempt,
        )

    async def run(self, task: Any, *, attempt: int = 0) -> TaskVerdict:
        async with self.hub() as hub:
            return await execute_task(task, self.runtime(hub, attempt=attempt))

    async def dev(self, path: str, body: dict[str, Any]) -> None:
        """Call one of the devhub's ``/api/v1/_dev`` control endpoints."""
        transport = httpx2.ASGITransport(app=self.app)
        async with httpx2.AsyncClient(transport=transport, base_url=HUB_URL) as client:
            answer = await client.post(
                f"/api/v1/_dev/{path}", json=body, headers={"Authorization": f"Bearer {HUB_KEY}"}
            )
            answer.raise_for_status()

    async def state(self) -> dict[str, Any]:
        async with self.hub() as hub:
            return await hub.dev_state()

    async def seed_post(self, content: str = "Hey @demo-agent, how do I scale workers?") -> str:
        async with self.hub() as hub:
            post = await hub.create_post(
                agent_id="alice", content=content, title="Scaling", idempotency_key="seed-1"
            )
        return post.id


def notification(post_id: str, task_id: str = "t-1", **extra: Any) -> dict[str, Any]:
    """A notification of the demo agent about ``post_id``."""
    return {
        "task_id": task_id,
        "type": "notification",
        "agent_id": "demo-agent",
        "post_id": post_id,
        "notification_id": "n-7",
        **extra,
    }
