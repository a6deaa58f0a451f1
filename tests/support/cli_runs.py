"""A CLI executor's run against the fake CLIs (tests/support/fake_clis), as the executor
tests and the tests of what a CLI run logs and traces build it.

``worker_secrets`` (an autouse fixture for the modules that import it) sets the secrets the
worker process holds and no CLI may see; ``make_request`` is an ExecutionRequest for a CLI
agent from ``make_agent``; ``executor`` runs a fake CLI as that agent type's executor.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker._spawn import ignore_spawn
from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig
from worker.executors import EXECUTORS, CliExecutor, ExecutionRequest
from worker.loop import NO_CONTROL, ControlSource, LoopSettings, RunLimits
from worker.models import Message
from worker.settings import Settings
from worker.task import Task
from worker.tools import EffectiveGrants

ANTHROPIC_KEY = "sk-ant-test-key-0123456789abcdef"
OPENAI_KEY = "sk-openai-test-key-0123456789abcdef"
MCP_TOKEN = "mcp-token-0123456789abcdef"
HUB_KEY = "hub-key-0123456789abcdef"
TOOL_CREDENTIAL = "ghp_toolcredential0123456789abcdefABCD"
PROMPT = "Please answer the thread about deploys."
SYSTEM = "You are a careful devops agent."


@pytest.fixture(autouse=True)
def worker_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Secrets the worker process holds that no CLI may ever see."""
    monkeypatch.setenv("HUB_API_KEY", HUB_KEY)
    monkeypatch.setenv("GITHUB_TOKEN", TOOL_CREDENTIAL)
    monkeypatch.setenv("MCP_AUTH_TOKEN", MCP_TOKEN)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    yield


def mcp_config_file(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "servers": {
                    "kit": {
                        "command": "true",
                        "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"},
                        "tools": {"echo": "kit:read", "add": "kit:write"},
                    }
                }
            }
        )
    )
    return path


def make_settings(*, mcp_config: Path | None = None) -> Settings:
    return Settings(
        anthropic_api_key=ANTHROPIC_KEY,  # type: ignore[arg-type]
        anthropic_base_url="http://127.0.0.1:9/anthropic",
        openai_api_key=OPENAI_KEY,  # type: ignore[arg-type]
        openai_base_url="http://127.0.0.1:9/v1",
        mcp_auth_token=MCP_TOKEN,  # type: ignore[arg-type]
        hub_api_key=HUB_KEY,  # type: ignore[arg-type]
        mcp_config=mcp_config,
        # The fakes run on the worker's own interpreter: the sandbox is tested with real
        # CLIs (tests/integration/test_cli_sandbox.py).
        cli_sandbox="off",
    )


def make_agent(
    agent_type: str,
    *,
    provider: str = "anthropic",
    grants: list[str] | None = None,
    shell: dict[str, Any] | None = None,
    model: str | None = None,
) -> AgentDefinition:
    model = model or ("claude-sonnet-4-5" if provider == "anthropic" else "gpt-4o-mini")
    config = AgentConfig.model_validate(
        {
            "name": "cli-agent",
            "type": agent_type,
            "brain": {"provider": provider, "model": model},
            "capabilities": {"grants": grants or [], "shell": shell or {}},
        }
    )
    return AgentDefinition(config=config, system_prompt=SYSTEM)


def make_request(
    agent: AgentDefinition,
    *,
    max_duration_s: float = 60.0,
    max_iterations: int = 5,
    strict_grants: bool = False,
    observers: list[Any] | None = None,
    control: ControlSource = NO_CONTROL,
    spawned: list[int] | None = None,
    deadline_epoch: float | None = None,
    worker_settings: Settings | None = None,
) -> ExecutionRequest:
    def no_toolbox() -> Any:
        raise AssertionError("a CLI executor never opens the worker's toolbox")

    def no_model() -> Any:
        raise AssertionError("a CLI executor never builds the worker's model")

    return ExecutionRequest(
        task=Task.model_validate(
            {
                "task_id": "t-cli-1",
                "type": "notification",
                "agent_id": "cli-agent",
                "post_id": "p-1",
            }
        ),
        agent=agent,
        system=SYSTEM,
        messages=[Message(role="user", content=PROMPT)],
        settings=LoopSettings(
            limits=RunLimits(max_iterations=max_iterations, max_duration_s=max_duration_s),
            deadline_epoch=deadline_epoch,
        ),
        worker_settings=worker_settings or make_settings(),
        grants=EffectiveGrants.of(agent.config.capabilities.grants, strict=strict_grants),
        open_toolbox=no_toolbox,
        make_model=no_model,
        observers=observers or [],
        control=control,
        on_spawn=spawned.append if spawned is not None else ignore_spawn,
    )


def executor(agent_type: str, fake: Path) -> CliExecutor:
    executor_class = EXECUTORS[agent_type]
    assert issubclass(executor_class, CliExecutor)
    return executor_class(executable=str(fake))
