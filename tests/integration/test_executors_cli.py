"""The real coding-agent CLIs, end to end (opt-in: RUN_CLI_TESTS=1).

A notification task for a ``claude-code`` agent runs through ``execute_task`` like
any other: the real ``claude`` binary talks to the scripted Anthropic endpoint,
calls ``hub__create_comment`` through the real gateway and our hub MCP server in
front of a real devhub, and its JSON result becomes the AgentReport. The real
``opencode`` runs one task through its executor against the same kind of setup.
Skipped, with the reason shown, unless RUN_CLI_TESTS=1 and the CLI is on PATH.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from hub_client import HubClient
from tests.support.definitions import write_agent
from tests.support.devhub import running_devhub
from tests.support.mcp_servers import running_mcp
from tests.support.mcp_test_servers.launch import stdio_entry
from worker import settings as worker_settings
from worker.agents import AgentDefinition, AgentStore
from worker.agents._config import AgentConfig
from worker.dev.scripted_endpoint import ScriptedEndpoint
from worker.executors import ExecutionRequest
from worker.executors._opencode import OpenCodeExecutor
from worker.jobs import TaskRuntime, execute_task
from worker.loop import LoopSettings, RunLimits
from worker.metrics import JobMetrics
from worker.models import Message
from worker.redaction import Redactor
from worker.settings import Settings
from worker.task import Outcome, Task
from worker.tools import EffectiveGrants
from worker.tools._idempotency import content_key

pytestmark = [
    pytest.mark.integration,
    pytest.mark.cli,
    pytest.mark.anyio,
    pytest.mark.skipif(
        os.environ.get("RUN_CLI_TESTS") != "1",
        reason="drives the real coding-agent CLIs: set RUN_CLI_TESTS=1 to run it",
    ),
    pytest.mark.timeout(300),
]
needs_claude = pytest.mark.skipif(
    shutil.which("claude") is None, reason="the claude CLI is not installed"
)
needs_opencode = pytest.mark.skipif(
    shutil.which("opencode") is None, reason="the opencode CLI is not installed"
)

HUB_KEY = "hub-key-for-cli-tests-0123456789"
MCP_TOKEN = "mcp-token-for-cli-tests-0123456789"
ANTHROPIC_KEY = "sk-ant-cli-test-0123456789abcdef"
AGENT = "claude-agent"
FINAL_TEXT = "I left the deploy steps as a comment in the thread."
COMMENT = "Deploys run through the pipeline: merge to main, then `make release`."


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    config = {
        "name": AGENT,
        "type": "claude-code",
        "brain": {"provider": "anthropic", "model": "claude-sonnet-4-5"},
        "capabilities": {"grants": ["hub:read", "hub:write"]},
        "behavior": {"max_iterations": 5},
        "limits": {"max_duration_s": 180},
    }
    write_agent(tmp_path, AGENT, config, prompt="You answer questions about deploys on the Hub.")
    return tmp_path


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    """The executor reads the worker's settings from the environment: read them anew."""
    worker_settings.settings.cache_clear()
    yield
    worker_settings.settings.cache_clear()


def not_for_clis(*_: Any) -> Any:
    raise AssertionError("a claude-code agent uses neither the worker's toolbox nor its model")


@needs_claude
async def test_claude_code_answers_through_the_gateway_into_the_report(
    agents_dir: Path,
    tmp_path: Path,
    redis_conn: redis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    fresh_settings: None,
) -> None:
    with (
        running_devhub(api_key=HUB_KEY) as hub,
        running_mcp("hub", hub_url=hub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN) as server,
        ScriptedEndpoint() as endpoint,
    ):
        mcp_config = tmp_path / "mcp.yaml"
        mcp_config.write_text(
            yaml.safe_dump(
                {
                    "servers": {
                        "hub": {
                            "url": server.url,
                            "first_party": True,
                            "tools": {
                                "search_posts": "hub:read",
                                "get_thread": "hub:read",
                                "create_comment": "hub:write",
                            },
                        }
                    }
                }
            )
        )
        for name, value in {
            "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "ANTHROPIC_BASE_URL": endpoint.anthropic_base_url,
            "MCP_CONFIG": str(mcp_config),
            "MCP_AUTH_TOKEN": MCP_TOKEN,
            "HUB_URL": hub.url,
            "HUB_API_KEY": HUB_KEY,
            "AGENTS_DIR": str(agents_dir),
            # The gateway counts the agent's writes there: never the machine's own Redis.
            "REDIS_URL": redis_url,
        }.items():
            monkeypatch.setenv(name, value)
        async with HubClient(hub.url, HUB_KEY) as client:
            post = await client.create_post(
                agent_id="alice",
                content=f"Hey @{AGENT}, how do we deploy?",
                title="Deploys",
                idempotency_key="seed-deploys",
            )
            endpoint.set_scenario(
                "default",
                [
                    {
                        "tool_calls": [
                            {
                                "name": "mcp__gateway__hub__create_comment",
                                "arguments": {"post_id": post.id, "content": COMMENT},
                            }
                        ],
                        "usage": {"input_tokens": 900, "output_tokens": 40},
                    },
                    {"text": FINAL_TEXT, "usage": {"input_tokens": 1000, "output_tokens": 20}},
                ],
            )
            settings = Settings()
            runtime = TaskRuntime(
                settings=settings,
                redis=redis_conn,
                agents=AgentStore(str(agents_dir), redis=redis_conn, ttl_s=0),
                metrics=JobMetrics(),
                redactor=Redactor(settings.secret_values()),
                make_model=not_for_clis,
                open_toolbox=not_for_clis,
                hub=client,
            )
            task = {
                "task_id": "t-claude-1",
                "type": "notification",
                "agent_id": AGENT,
                "post_id": post.id,
            }
            verdict = await execute_task(task, runtime)
        state = hub.state()
        requests = endpoint.requests()

    report = verdict.report
    assert report.outcome is Outcome.COMPLETED, report.error
    assert report.error is None
    assert report.output == FINAL_TEXT
    assert report.iterations == 2  # claude's num_turns
    assert report.llm_calls == 2
    assert report.tool_calls == 1
    assert report.tokens_input >= 1900 and report.tokens_output >= 60
    assert report.cost_usd is not None and report.cost_usd > 0
    # The comment came through the gateway, as the agent: the final text is not posted again.
    [comment] = state["comments"]
    assert comment["content"] == COMMENT
    assert comment["author"]["id"] == AGENT
    assert report.posted == [comment["id"]]
    [consumption] = state["consumption"]
    assert consumption["activation_id"] == "t-claude-1"
    # Claude saw only the gateway's granted tools, and our system prompt.
    offered = {tool["name"] for tool in requests[0]["body"].get("tools", [])}
    assert offered == {
        "mcp__gateway__hub__search_posts",
        "mcp__gateway__hub__get_thread",
        "mcp__gateway__hub__create_comment",
    }
    system_blocks = requests[0]["body"]["system"]
    assert any("answer questions about deploys" in block["text"] for block in system_blocks)
    assert "<untrusted-content" in str(requests[0]["body"]["messages"])
    assert ANTHROPIC_KEY not in str(requests)


@needs_opencode
async def test_opencode_calls_granted_tools_only_and_reports_usage(tmp_path: Path) -> None:
    mcp_config = tmp_path / "mcp.yaml"
    mcp_config.write_text(
        yaml.safe_dump(
            {"servers": {"kit": stdio_entry("toolkit", {"echo": "kit:read", "add": "kit:write"})}}
        )
    )
    agent = AgentDefinition(
        config=AgentConfig.model_validate(
            {
                "name": "opencode-agent",
                "type": "opencode",
                "brain": {"provider": "openai", "model": "gpt-4o-mini"},
                "capabilities": {"grants": ["kit:read"]},
            }
        ),
        system_prompt="You are terse.",
    )
    with ScriptedEndpoint() as endpoint:
        endpoint.set_scenario(
            "default",
            [
                {"tool_calls": [{"name": "gateway_kit__echo", "arguments": {"text": "ping"}}]},
                {"text": "pong received", "usage": {"input_tokens": 70, "output_tokens": 9}},
            ],
        )
        settings = Settings(
            openai_api_key="sk-opencode-cli-test-0123456789",  # type: ignore[arg-type]
            openai_base_url=endpoint.openai_base_url,
            mcp_config=mcp_config,
        )
        request = ExecutionRequest(
            task=Task.model_validate(
                {"task_id": "t-oc-1", "type": "exploration", "agent_id": "opencode-agent"}
            ),
            agent=agent,
            system="You are terse.",
            messages=[Message(role="user", content="Echo ping, then report.")],
            settings=LoopSettings(limits=RunLimits(max_iterations=5, max_duration_s=180)),
            worker_settings=settings,
            grants=EffectiveGrants.of(agent.config.capabilities.grants),
            open_toolbox=not_for_clis,
            make_model=not_for_clis,
        )
        result = await OpenCodeExecutor().run(request)
        requests = endpoint.requests()

    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.output == "pong received"
    assert result.state.iterations == 2
    [call] = [call for step in result.steps for call in step.tool_calls]
    assert (call.name, call.outcome) == ("kit__echo", "ok")
    key = content_key("t-oc-1", "kit__echo", {"text": "ping"}, 1)
    assert f'"idempotency_key": "{key}"' in call.content
    assert result.state.usage.output_tokens >= 9
    assert result.state.usage.cost_usd is None  # no price for an OpenAI-compatible endpoint
    offered = {tool["function"]["name"] for tool in requests[0]["body"].get("tools", [])}
    assert offered == {"gateway_kit__echo"}
