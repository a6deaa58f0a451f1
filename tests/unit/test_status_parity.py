"""One provider status, one end: a native agent and a CLI agent finish a task the same way.

Each status reaches the pipeline (``execute_task``, with the in-process devhub and
fakeredis) twice: from the real anthropic SDK answering it over ``httpx2.MockTransport``
for a native agent, and from the fake ``claude`` CLI reporting it as its
``api_error_status`` for a claude-code agent. docs/http-status.md tables the outcomes.
"""

from __future__ import annotations

from pathlib import Path

import fakeredis
import httpx2
import pytest

from tests.support.definitions import write_agent
from tests.support.fake_clis import install_fake_cli
from tests.support.pipeline import in_process_hub, task_runtime
from worker.jobs import execute_task
from worker.models import Model
from worker.models._anthropic import AnthropicModel
from worker.models._retry import RetryPolicy
from worker.settings import Settings
from worker.task import AgentReport, Outcome

pytestmark = pytest.mark.anyio

HUB_KEY = "hub-parity-key-0123456789"
ANTHROPIC_KEY = "sk-ant-parity-key-0123456789abcdef"
BRAIN = {"provider": "anthropic", "model": "claude-sonnet-4-5"}
# Requeued: the task runs again later; model_error: it fails for good.
EXPECTED = {
    400: Outcome.MODEL_ERROR,
    401: Outcome.MODEL_ERROR,
    403: Outcome.MODEL_ERROR,
    404: Outcome.MODEL_ERROR,
    408: Outcome.REQUEUED,
    409: Outcome.REQUEUED,
    422: Outcome.MODEL_ERROR,
    429: Outcome.REQUEUED,
    500: Outcome.REQUEUED,
    501: Outcome.MODEL_ERROR,
    502: Outcome.REQUEUED,
    503: Outcome.REQUEUED,
    504: Outcome.REQUEUED,
    505: Outcome.MODEL_ERROR,
    529: Outcome.REQUEUED,
}


@pytest.fixture
def agents_root(tmp_path: Path) -> Path:
    write_agent(tmp_path, "native-agent", {"name": "native-agent", "brain": BRAIN})
    write_agent(
        tmp_path,
        "cli-agent",
        {"name": "cli-agent", "type": "claude-code", "brain": BRAIN},
    )
    return tmp_path


@pytest.fixture
def fake_claude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return install_fake_cli("claude", bin_dir)


def provider_answering(status: int) -> Model:
    """The real anthropic SDK whose every request is answered with ``status``."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = {"type": "error", "error": {"type": "api_error", "message": f"status {status}"}}
        return httpx2.Response(status, json=body)

    async def no_wait(seconds: float) -> None:
        return None

    return AnthropicModel(
        BRAIN["model"],
        api_key=ANTHROPIC_KEY,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer)),
        retry=RetryPolicy(max_retries=1, jitter=False, sleep=no_wait),
    )


async def task_outcome(
    agent_id: str, status: int, agents_root: Path, redis: fakeredis.FakeRedis
) -> AgentReport:
    async with in_process_hub(HUB_KEY) as hub:
        post = await hub.create_post(
            agent_id="alice", content=f"@{agent_id} hello?", idempotency_key=f"seed-{status}"
        )
        settings = Settings(
            hub_url="http://devhub",
            hub_api_key=HUB_KEY,  # type: ignore[arg-type]
            anthropic_api_key=ANTHROPIC_KEY,  # type: ignore[arg-type]
            anthropic_base_url="http://127.0.0.1:9/anthropic",
            cli_sandbox="off",  # the fake runs on this interpreter
        )
        runtime = task_runtime(
            hub,
            redis,
            provider_answering(status),
            agents_dir=agents_root,
            api_key=HUB_KEY,
            settings=settings,
            also_secret=[ANTHROPIC_KEY],
        )
        task = {
            "task_id": f"{agent_id}-{status}",
            "type": "notification",
            "agent_id": agent_id,
            "post_id": post.id,
        }
        verdict = await execute_task(task, runtime)
    return verdict.report


@pytest.mark.parametrize("status", sorted(EXPECTED))
async def test_a_native_and_a_cli_agent_end_the_same_way_for_each_provider_status(
    status: int, agents_root: Path, fake_claude: Path, redis: fakeredis.FakeRedis
) -> None:
    install_fake_cli(
        "claude",
        fake_claude.parent,
        {
            "result": {
                "is_error": True,
                "api_error_status": status,
                "result": f"API Error: {status}",
            }
        },
    )

    native = await task_outcome("native-agent", status, agents_root, redis)
    cli = await task_outcome("cli-agent", status, agents_root, redis)

    assert (native.outcome, cli.outcome) == (EXPECTED[status], EXPECTED[status])
    # Both ended on the provider's answer, not on something that failed before it.
    for report in (native, cli):
        assert report.error is not None
        assert f"HTTP {status}" in report.error.message
