"""CLI executors against fake CLIs that accept only the real CLIs' flags.

Each fake records its argv, environment, stdin and the files its flags name, and
prints that CLI's output shape, so these tests see exactly what a real CLI would be
given and how its answer becomes the RunResult (hence the AgentReport).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.support.cli_runs import (
    ANTHROPIC_KEY,
    HUB_KEY,
    MCP_TOKEN,
    OPENAI_KEY,
    PROMPT,
    SYSTEM,
    TOOL_CREDENTIAL,
    executor,
    make_agent,
    make_request,
    make_settings,
    mcp_config_file,
)
from tests.support.cli_runs import worker_secrets as worker_secrets  # an autouse fixture
from tests.support.fake_clis import install_fake_cli, read_record, set_scenario
from tests.support.jobs import assert_gone
from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig
from worker.exceptions import (
    AgentConfigError,
    ExecutorError,
    ModelAuthError,
    ModelRequestError,
    ModelUnavailable,
)
from worker.executors import executor_for
from worker.executors._aider import AiderExecutor
from worker.executors._base import NativeExecutor
from worker.executors._call_log import Denial, GatewayActivity, read_call_log
from worker.executors._claude import ClaudeCodeExecutor
from worker.executors._gateway_link import GatewaySpec
from worker.executors._goose import GooseExecutor
from worker.executors._listing import main as list_executors
from worker.executors._opencode import OpenCodeExecutor
from worker.executors._transcript import CliTranscript, CliTurn, RunContext, run_result
from worker.loop import (
    Control,
    GrantDenied,
    LlmCalled,
    LoopEvent,
    RunLimits,
    ToolCalled,
    ToolCallRecord,
)
from worker.loop._events import EventBus
from worker.models import Message, Usage
from worker.task import Outcome

pytestmark = pytest.mark.anyio

# Besides PATH, HOME and LANG: the credential, the endpoint and the CLI's own switches.
CLI_VARIABLES = {
    "claude-code": {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "CLAUDE_CODE_MAX_RETRIES",
        "MCP_CONNECTION_NONBLOCKING",
        "MCP_CONNECT_TIMEOUT_MS",
        "MCP_TOOL_TIMEOUT",
    },
    "opencode": {"ANTHROPIC_API_KEY", "OPENCODE_CONFIG_CONTENT"},
    "aider": {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"},
    "goose": {"ANTHROPIC_API_KEY", "ANTHROPIC_HOST", "GOOSE_MODE", "GOOSE_DISABLE_KEYRING"},
}
EXECUTOR_BINARIES = {
    "claude-code": "claude",
    "opencode": "opencode",
    "aider": "aider",
    "goose": "goose",
}


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    return directory


def option(record: dict[str, Any], flag: str) -> str | None:
    values = record["options"].get(flag)
    return values[-1] if values else None


# --- registry ------------------------------------------------------------------------------


def test_every_agent_type_has_its_executor() -> None:
    assert isinstance(executor_for("native"), NativeExecutor)
    assert isinstance(executor_for("claude-code"), ClaudeCodeExecutor)
    assert isinstance(executor_for("opencode"), OpenCodeExecutor)
    assert isinstance(executor_for("aider"), AiderExecutor)
    assert isinstance(executor_for("goose"), GooseExecutor)
    with pytest.raises(AgentConfigError, match="no executor for agent type 'cursor'"):
        executor_for("cursor")


# --- claude-code ---------------------------------------------------------------------------


async def test_claude_command_line_prompt_and_system_prompt(bin_dir: Path) -> None:
    fake = install_fake_cli("claude", bin_dir)
    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))
    record = read_record(fake)

    assert "failed" not in record, record.get("failed")
    options = record["options"]
    assert "-p" in options
    assert option(record, "--output-format") == "json"
    assert option(record, "--model") == "claude-sonnet-4-5"
    assert option(record, "--max-turns") == "5"
    assert options["--tools"] == [""]
    assert "--strict-mcp-config" in options
    assert "--mcp-config" not in options  # no MCP_CONFIG: no gateway, no tools
    assert record["positionals"] == []
    assert record["stdin"] == PROMPT
    system_file = option(record, "--system-prompt-file")
    assert system_file is not None and record["files"][system_file] == SYSTEM
    assert not await anyio.Path(system_file).exists()  # the private directory is gone

    assert result.outcome is Outcome.COMPLETED
    assert result.error is None
    assert result.output == "fake claude answer"
    assert result.state.iterations == 1
    assert result.state.llm_calls == 1
    assert result.state.usage == Usage(
        input_tokens=150,
        output_tokens=40,
        cost_usd=0.0123,
        cache_read_tokens=30,
        cache_write_tokens=20,
    )
    assert result.messages[-1] == Message(role="assistant", content="fake claude answer")


async def test_claude_gets_the_gateway_and_only_its_tools(tmp_path: Path, bin_dir: Path) -> None:
    fake = install_fake_cli("claude", bin_dir)
    settings = make_settings(mcp_config=mcp_config_file(tmp_path))
    agent = make_agent("claude-code", grants=["kit:read"])
    await executor("claude-code", fake).run(
        make_request(agent, strict_grants=True, worker_settings=settings)
    )
    record = read_record(fake)

    assert option(record, "--allowedTools") == "mcp__gateway"
    gateway = record["mcp_servers"]["gateway"]
    # The CLI starts only the bridge to the gateway the worker runs, with no environment:
    # no grant list, no path to a call log or to secrets, nothing to read.
    helper, command, socket_path, _wait_s = gateway["args"]
    assert (Path(helper).name, command) == ("sandbox_helper.py", "bridge")
    assert Path(socket_path).name == "gateway.sock"
    assert gateway["env"] == {}
    everything_the_cli_saw = json.dumps(record)
    for secret in (MCP_TOKEN, TOOL_CREDENTIAL, HUB_KEY, OPENAI_KEY):
        assert secret not in everything_the_cli_saw


@pytest.mark.parametrize("agent_type", ["claude-code", "opencode", "aider", "goose"])
async def test_environment_holds_only_the_llm_credential(
    agent_type: str, tmp_path: Path, bin_dir: Path
) -> None:
    fake = install_fake_cli(EXECUTOR_BINARIES[agent_type], bin_dir)
    grants = [] if agent_type == "aider" else ["kit:read"]
    settings = make_settings(mcp_config=mcp_config_file(tmp_path))
    agent = make_agent(agent_type, grants=grants)
    result = await executor(agent_type, fake).run(make_request(agent, worker_settings=settings))
    record = read_record(fake)

    assert result.error is None, result.error
    env = record["env"]
    assert env["HOME"] == record["cwd"]
    assert not await anyio.Path(record["cwd"]).exists()  # the scratch workspace is removed
    assert set(env) == {"PATH", "HOME", "LANG", *CLI_VARIABLES[agent_type]}
    assert ANTHROPIC_KEY in env.values()
    serialized = json.dumps(record)
    for secret in (HUB_KEY, TOOL_CREDENTIAL, MCP_TOKEN, OPENAI_KEY):
        assert secret not in serialized


@pytest.mark.parametrize(
    ("result_fields", "outcome", "error_class"),
    [
        (
            {"is_error": True, "subtype": "success", "api_error_status": 401, "result": "bad key"},
            Outcome.MODEL_ERROR,
            ModelAuthError,
        ),
        (
            {"is_error": True, "subtype": "success", "api_error_status": 529, "result": "busy"},
            Outcome.MODEL_ERROR,
            ModelUnavailable,
        ),
        (
            {"is_error": True, "subtype": "success", "api_error_status": 400, "result": "no"},
            Outcome.MODEL_ERROR,
            ModelRequestError,
        ),
        (
            {"is_error": True, "subtype": "error_during_execution", "result": "boom"},
            Outcome.ERROR,
            ExecutorError,
        ),
    ],
)
async def test_claude_is_error_is_checked_even_when_subtype_says_success(
    bin_dir: Path, result_fields: dict[str, Any], outcome: Outcome, error_class: type
) -> None:
    fake = install_fake_cli("claude", bin_dir, {"result": result_fields})
    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))

    assert result.outcome is outcome
    assert isinstance(result.error, error_class)
    assert "claude-code" in str(result.error)
    assert result.output == ""


async def test_claude_max_turns_is_max_iterations(bin_dir: Path) -> None:
    fake = install_fake_cli(
        "claude",
        bin_dir,
        # As the real CLI does, num_turns counts the turn it refused to start.
        {"result": {"subtype": "error_max_turns", "is_error": True, "num_turns": 4, "result": ""}},
    )
    result = await executor("claude-code", fake).run(
        make_request(make_agent("claude-code"), max_iterations=3)
    )

    assert option(read_record(fake), "--max-turns") == "3"
    assert result.outcome is Outcome.MAX_ITERATIONS
    assert result.error is None
    assert result.state.iterations == 3
    assert result.fallback is True  # no text from the CLI: the fixed fallback, never posted
    assert "max_iterations reached" in result.detail


async def test_claude_budget_limit_is_passed_and_reported(bin_dir: Path) -> None:
    fake = install_fake_cli(
        "claude", bin_dir, {"result": {"subtype": "error_max_budget_usd", "is_error": True}}
    )
    request = make_request(make_agent("claude-code"))
    request.settings.limits = RunLimits(max_cost_usd=0.05)
    result = await executor("claude-code", fake).run(request)

    assert option(read_record(fake), "--max-budget-usd") == "0.0500"
    assert result.outcome is Outcome.BUDGET


async def test_claude_refused_calls_are_tool_calls_of_the_report(bin_dir: Path) -> None:
    denial = {"tool_name": "Bash", "tool_use_id": "toolu_1", "tool_input": {"command": "ls"}}
    fake = install_fake_cli(
        "claude", bin_dir, {"result": {"permission_denials": [denial], "num_turns": 2}}
    )
    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))

    assert result.state.tool_calls == 1
    [call] = result.steps[0].tool_calls
    assert (call.name, call.outcome, call.is_error) == ("Bash", "refused", True)


async def test_claude_shell_is_limited_to_the_allowed_commands(bin_dir: Path) -> None:
    fake = install_fake_cli("claude", bin_dir)
    shell = {"enabled": True, "allowed_commands": ["git", "ls"], "blocked_patterns": ["rm -rf"]}
    await executor("claude-code", fake).run(make_request(make_agent("claude-code", shell=shell)))
    record = read_record(fake)

    assert record["options"]["--tools"] == ["Bash"]
    assert option(record, "--allowedTools") == "Bash(git:*),Bash(ls:*)"
    assert option(record, "--disallowedTools") == "Bash(rm -rf:*)"
    # capabilities.shell.timeout_seconds (the public format's default, 120 s) bounds each command.
    assert record["env"]["BASH_DEFAULT_TIMEOUT_MS"] == record["env"]["BASH_MAX_TIMEOUT_MS"]
    assert record["env"]["BASH_DEFAULT_TIMEOUT_MS"] == "120000"


async def test_claude_code_needs_an_anthropic_brain(bin_dir: Path) -> None:
    fake = install_fake_cli("claude", bin_dir)
    agent = make_agent("claude-code", provider="openai")
    result = await executor("claude-code", fake).run(make_request(agent))

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, AgentConfigError)
    assert "brain.provider: anthropic" in str(result.error)
    assert read_record(fake) == {}  # it never started


@pytest.mark.parametrize(
    ("copied_secret", "api_base"),
    [
        (HUB_KEY, None),  # at the operator's endpoint: a copy of another worker secret
        (ANTHROPIC_KEY, "http://127.0.0.1:9/elsewhere"),  # the worker's key, elsewhere
    ],
)
async def test_an_agent_key_holding_a_worker_secret_is_refused(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, copied_secret: str, api_base: str | None
) -> None:
    monkeypatch.setenv("AGENT_OWN_KEY", copied_secret)
    fake = install_fake_cli("claude", bin_dir)
    brain = {"provider": "anthropic", "model": "claude-sonnet-4-5", "api_key_env": "AGENT_OWN_KEY"}
    if api_base is not None:
        brain["api_base"] = api_base
    config = AgentConfig.model_validate(
        {"name": "cli-agent", "type": "claude-code", "brain": brain}
    )
    settings = make_settings().model_copy(
        update={
            "agent_key_envs": ["AGENT_OWN_KEY"],
            "provider_base_urls": ["http://127.0.0.1:9/elsewhere"],
        }
    )
    agent = AgentDefinition(config=config, system_prompt=SYSTEM)
    result = await executor("claude-code", fake).run(make_request(agent, worker_settings=settings))

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, AgentConfigError)
    assert "one of the worker's own secrets" in str(result.error)
    assert read_record(fake) == {}  # it never started


# --- failures every CLI shares ---------------------------------------------------------------


async def test_non_zero_exit_is_an_executor_error_with_a_redacted_stderr_tail(
    bin_dir: Path,
) -> None:
    scenario = {
        "stdout": "",
        "stderr": f"fatal: auth with {ANTHROPIC_KEY} refused\n",
        "exit_code": 3,
    }
    fake = install_fake_cli("claude", bin_dir, scenario)
    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, ExecutorError)
    message = str(result.error)
    assert "claude-code exited with status 3" in message
    assert "fatal: auth with" in message
    assert ANTHROPIC_KEY not in message


async def test_a_key_the_stderr_tail_would_cut_through_is_masked_whole(bin_dir: Path) -> None:
    # The tail keeps the last 600 characters: they start ten characters into the key.
    filler = "x" * (600 - len(ANTHROPIC_KEY[10:]) - 1)
    scenario = {"stdout": "", "stderr": f"fatal: {ANTHROPIC_KEY} {filler}\n", "exit_code": 3}
    fake = install_fake_cli("claude", bin_dir, scenario)
    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))

    message = str(result.error)
    assert filler in message and ANTHROPIC_KEY[10:20] not in message


async def test_garbage_output_names_the_cli_and_what_was_wrong(bin_dir: Path) -> None:
    fake = install_fake_cli(
        "claude", bin_dir, {"stdout": "Segmentation fault? <html>", "exit_code": 0}
    )
    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, ExecutorError)
    assert "claude-code printed no JSON result object" in str(result.error)


async def test_missing_binary_is_reported_clearly(bin_dir: Path) -> None:
    missing = ClaudeCodeExecutor(executable=str(bin_dir / "no-such-claude"))
    result = await missing.run(make_request(make_agent("claude-code")))

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, ExecutorError)
    assert "not installed on this worker" in str(result.error)
    assert "install it with `npm install -g @anthropic-ai/claude-code`" in str(result.error)


async def test_deadline_kills_the_cli_and_everything_it_started(bin_dir: Path) -> None:
    fake = install_fake_cli("claude", bin_dir, {"spawn_grandchild": True, "sleep_s": 120})
    spawned: list[int] = []
    started = time.monotonic()
    result = await executor("claude-code", fake).run(
        make_request(make_agent("claude-code"), max_duration_s=2.0, spawned=spawned)
    )
    record = read_record(fake)

    assert result.outcome is Outcome.DEADLINE
    assert result.fallback is True
    assert "max_duration_s reached" in result.detail
    assert spawned == [record["pid"]]  # reported so a crashed worker's parent can kill it
    assert time.monotonic() - started < 60  # it did not wait for the CLI's own 120 s
    assert_gone(record["pid"])
    assert_gone(record["grandchild_pid"])


async def test_a_resumed_task_gives_its_cli_the_time_left_not_a_fresh_duration(
    bin_dir: Path,
) -> None:
    # An earlier run fixed the deadline; 2 s of the task's 600 s are left. The CLI would
    # answer after 60 s: it is stopped at the task's deadline instead.
    fake = install_fake_cli("claude", bin_dir, {"sleep_s": 60})
    request = make_request(
        make_agent("claude-code"), max_duration_s=600.0, deadline_epoch=time.time() + 2.0
    )
    result = await executor("claude-code", fake).run(request)

    assert result.outcome is Outcome.DEADLINE
    assert "max_duration_s reached" in result.detail
    assert_gone(read_record(fake)["pid"])


async def test_a_cli_stopped_at_the_deadline_keeps_what_it_reported(bin_dir: Path) -> None:
    fake = install_fake_cli(
        "opencode", bin_dir, {"texts": ["Half an answer"], "hang_after_output_s": 120}
    )
    result = await executor("opencode", fake).run(
        make_request(make_agent("opencode"), max_duration_s=3.0)
    )

    assert result.outcome is Outcome.DEADLINE
    assert result.output == "Half an answer"
    assert result.state.usage == Usage(
        input_tokens=55, output_tokens=12, cost_usd=0.004, cache_read_tokens=5
    )
    assert_gone(read_record(fake)["pid"])


class CancelAfterFirstPoll:
    def __init__(self) -> None:
        self.polls = 0

    async def poll(self) -> Control:
        self.polls += 1
        return Control(cancelled=True, steering=["ignored"])


async def test_cancel_stops_the_cli(bin_dir: Path) -> None:
    fake = install_fake_cli("claude", bin_dir, {"sleep_s": 120})
    control = CancelAfterFirstPoll()
    result = await executor("claude-code", fake).run(
        make_request(make_agent("claude-code"), control=control)
    )

    assert control.polls >= 1
    assert result.outcome is Outcome.CANCELLED
    assert result.output == "The task was cancelled."
    assert_gone(read_record(fake)["pid"])


# --- aider -----------------------------------------------------------------------------------


async def test_aider_refuses_an_agent_that_claims_grants(bin_dir: Path) -> None:
    fake = install_fake_cli("aider", bin_dir)
    agent = make_agent("aider", grants=["hub:read", "hub:write"])
    result = await executor("aider", fake).run(make_request(agent))

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, AgentConfigError)
    assert "aider agents cannot use tools" in str(result.error)
    assert "remove capabilities.grants or choose another type" in str(result.error)
    assert read_record(fake) == {}


async def test_aider_command_line_system_prompt_and_answer(bin_dir: Path) -> None:
    answer = "Deploys go through the pipeline.\n\n> quoted from the thread\nThat is all."
    fake = install_fake_cli("aider", bin_dir, {"answer": answer})
    result = await executor("aider", fake).run(make_request(make_agent("aider", provider="openai")))
    record = read_record(fake)

    assert "failed" not in record, record.get("failed")
    assert option(record, "--model") == "openai/gpt-4o-mini"
    assert option(record, "--chat-mode") == "ask"
    for switch in (
        "--yes-always",
        "--no-git",
        "--no-stream",
        "--no-pretty",
        "--no-suggest-shell-commands",
        "--no-detect-urls",
        "--no-analytics",
    ):
        assert switch in record["options"]
    assert option(record, "--map-tokens") == "0"
    assert record["files"][option(record, "--message-file")] == PROMPT
    [settings_entry] = yaml.safe_load(record["files"][option(record, "--model-settings-file")])
    assert settings_entry == {"name": "openai/gpt-4o-mini", "system_prompt_prefix": SYSTEM}
    assert record["env"]["OPENAI_API_BASE"] == "http://127.0.0.1:9/v1"
    assert record["env"]["OPENAI_API_KEY"] == OPENAI_KEY

    assert result.outcome is Outcome.COMPLETED
    assert result.output == answer
    assert result.state.usage == Usage(input_tokens=1200, output_tokens=56, cost_usd=0.0036)
    assert result.state.llm_calls == 1
    assert result.state.tool_calls == 0


async def test_aider_without_a_known_price_reports_no_cost(bin_dir: Path) -> None:
    fake = install_fake_cli("aider", bin_dir, {"tokens_line": "Tokens: 12k sent, 340 received."})
    result = await executor("aider", fake).run(make_request(make_agent("aider")))

    assert result.state.usage == Usage(input_tokens=12000, output_tokens=340, cost_usd=None)


async def test_aider_reports_what_it_read_from_and_wrote_to_the_prompt_cache(
    bin_dir: Path,
) -> None:
    line = "Tokens: 12k sent, 2.3k cache write, 8.1k cache hit, 340 received."
    fake = install_fake_cli("aider", bin_dir, {"tokens_line": line})
    result = await executor("aider", fake).run(make_request(make_agent("aider")))

    usage = result.state.usage
    assert (usage.input_tokens, usage.cache_write_tokens, usage.cache_read_tokens) == (
        12000,
        2300,
        8100,
    )


async def test_aider_provider_errors_are_model_errors(bin_dir: Path) -> None:
    failure = (
        "Aider v0.86.2\nModel: anthropic/claude-sonnet-4-5 with ask edit format\n\n"
        "litellm.AuthenticationError: AuthenticationError: AnthropicException - invalid key\n"
        "The API provider is not able to authenticate you. Check your API key.\n"
    )
    fake = install_fake_cli("aider", bin_dir, {"stdout": failure, "exit_code": 0})
    result = await executor("aider", fake).run(make_request(make_agent("aider")))

    assert result.outcome is Outcome.MODEL_ERROR
    assert isinstance(result.error, ModelAuthError)


# --- opencode --------------------------------------------------------------------------------


async def test_opencode_configuration_and_events(tmp_path: Path, bin_dir: Path) -> None:
    fake = install_fake_cli("opencode", bin_dir, {"texts": ["Deploys ", "are fine."]})
    settings = make_settings(mcp_config=mcp_config_file(tmp_path))
    agent = make_agent("opencode", grants=["kit:read"])
    result = await executor("opencode", fake).run(make_request(agent, worker_settings=settings))
    record = read_record(fake)

    assert "failed" not in record, record.get("failed")
    assert record["argv"][0] == "run"
    assert option(record, "-m") == "anthropic/claude-sonnet-4-5"
    assert option(record, "--format") == "json"
    assert option(record, "--title") == "t-cli-1"
    assert record["stdin"] == PROMPT
    config = record["config"]
    assert config["agent"]["build"]["prompt"] == SYSTEM
    assert config["small_model"] == "anthropic/claude-sonnet-4-5"
    assert config["permission"] == {"*": "deny", "gateway_*": "allow"}
    provider = config["provider"]["anthropic"]["options"]
    assert provider == {
        "baseURL": "http://127.0.0.1:9/anthropic/v1",
        "apiKey": "{env:ANTHROPIC_API_KEY}",
    }
    gateway = config["mcp"]["gateway"]
    assert gateway["type"] == "local" and gateway["enabled"] is True
    assert gateway["command"][2:3] == ["bridge"]
    assert gateway["environment"] == {}

    assert result.outcome is Outcome.COMPLETED
    assert result.output == "Deploys are fine."
    # One step: 50 + 5 cache read in, 10 + 2 reasoning out, $0.004.
    assert result.state.usage == Usage(
        input_tokens=55, output_tokens=12, cost_usd=0.004, cache_read_tokens=5
    )


async def test_opencode_speaks_chat_completions_to_openai_endpoints(bin_dir: Path) -> None:
    fake = install_fake_cli("opencode", bin_dir, {"cost": 0})
    result = await executor("opencode", fake).run(
        make_request(make_agent("opencode", provider="openai"))
    )
    record = read_record(fake)

    provider = record["config"]["provider"]["worker-openai"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:9/v1"
    assert option(record, "-m") == "worker-openai/gpt-4o-mini"
    assert record["env"]["OPENAI_API_KEY"] == OPENAI_KEY
    assert "mcp" not in record["config"]  # no MCP_CONFIG: no gateway
    assert result.state.usage.cost_usd is None  # tokens for $0: the price is unknown


async def test_opencode_error_event_becomes_a_model_error(bin_dir: Path) -> None:
    error = {
        "type": "error",
        "error": {"name": "APIError", "data": {"message": "Unauthorized", "statusCode": 401}},
    }
    fake = install_fake_cli("opencode", bin_dir, {"events": [error]})
    result = await executor("opencode", fake).run(make_request(make_agent("opencode")))

    assert result.outcome is Outcome.MODEL_ERROR
    assert isinstance(result.error, ModelAuthError)
    assert "Unauthorized" in str(result.error)


async def test_opencode_declares_any_model_and_names_its_own_error(bin_dir: Path) -> None:
    # OpenCode 1.18's event and log line for a model outside its catalogue, as seen offline.
    unknown = {
        "type": "error",
        "error": {
            "name": "UnknownError",
            "data": {"message": "Unexpected server error.", "ref": "err_89ab660d"},
        },
    }
    logged = (
        "timestamp=2026-11-27T16:10:09.140Z level=ERROR run=db8eaffa message=failed "
        'ref=err_89ab660d error="ProviderModelNotFoundError: Model not found: '
        'anthropic/claude-private-7. Did you mean: claude-haiku-4-5?" cause="…\\n at x"\n'
    )
    fake = install_fake_cli("opencode", bin_dir, {"events": [unknown], "stderr": logged})
    result = await executor("opencode", fake).run(
        make_request(make_agent("opencode", model="claude-private-7"))
    )
    record = read_record(fake)

    anthropic = record["config"]["provider"]["anthropic"]
    assert anthropic["models"] == {"claude-private-7": {"name": "claude-private-7"}}
    assert "--print-logs" in record["argv"] and option(record, "--log-level") == "ERROR"
    assert isinstance(result.error, ExecutorError)
    assert "ProviderModelNotFoundError: Model not found: anthropic/claude-private-7" in str(
        result.error
    )
    assert "UnknownError" not in str(result.error)


# --- goose -----------------------------------------------------------------------------------


async def test_goose_command_line_and_output(tmp_path: Path, bin_dir: Path) -> None:
    fake = install_fake_cli("goose", bin_dir)
    settings = make_settings(mcp_config=mcp_config_file(tmp_path))
    agent = make_agent("goose", provider="openai", grants=["kit:read"])
    result = await executor("goose", fake).run(make_request(agent, worker_settings=settings))
    record = read_record(fake)

    assert "failed" not in record, record.get("failed")
    assert record["argv"][0] == "run"
    assert "--no-session" in record["options"]
    assert option(record, "-i") == "-"
    assert record["stdin"] == PROMPT
    assert option(record, "--provider") == "openai"
    assert option(record, "--model") == "gpt-4o-mini"
    assert option(record, "--output-format") == "json"
    assert option(record, "--system") == SYSTEM
    assert option(record, "--max-turns") == "5"
    extension = option(record, "--with-extension") or ""
    # Only the bridge to the worker's gateway: no environment block for the CLI to read.
    assert extension.split()[2] == "bridge"
    assert "=" not in extension
    env = record["env"]
    assert env["GOOSE_MODE"] == "auto"
    assert (env["OPENAI_HOST"], env["OPENAI_BASE_PATH"]) == (
        "http://127.0.0.1:9",
        "v1/chat/completions",
    )

    assert result.outcome is Outcome.COMPLETED
    assert result.output == "fake goose answer"
    assert result.state.usage == Usage(input_tokens=300, output_tokens=21, cost_usd=None)


# --- the report of a CLI run -------------------------------------------------------------------


def _record(name: str, outcome: str = "ok") -> ToolCallRecord:
    return ToolCallRecord(
        call_id=name,
        name=name,
        arguments="{}",
        server="kit",
        outcome=outcome,
        is_error=outcome != "ok",
        content="",
    )


def test_tool_calls_go_to_the_turns_that_made_them_and_are_observed() -> None:
    events: list[LoopEvent] = []
    context = RunContext(
        executor="claude-code",
        task_id="t-1",
        agent_id="a",
        provider="anthropic",
        model="m",
        messages=[Message(role="user", content="hi")],
        events=EventBus([events.append]),
    )
    activity = GatewayActivity(
        calls=[_record("kit__a"), _record("kit__b"), _record("kit__c", "missing_grant")]
    )
    activity.denials.append(Denial(step=3, tool="kit__c", required_grant="kit:write"))
    transcript = CliTranscript(
        output="done",
        turns=[CliTurn(), CliTurn(), CliTurn(text="done")],
        usage=Usage(input_tokens=10, output_tokens=5, cost_usd=0.01),
    )
    result = run_result(context, transcript, activity, duration_s=1.0)

    assert [[c.name for c in step.tool_calls] for step in result.steps] == [
        ["kit__a"],
        ["kit__b", "kit__c"],  # the surplus stays on the last turn that made calls
        [],
    ]
    assert result.steps[-1].usage == Usage(input_tokens=10, output_tokens=5, cost_usd=0.01)
    assert result.state.iterations == 3
    assert result.state.tool_calls == 3
    assert sum(isinstance(event, LlmCalled) for event in events) == 3
    assert [e.tool for e in events if isinstance(e, ToolCalled)] == ["kit__a", "kit__b", "kit__c"]
    assert [e.required_grant for e in events if isinstance(e, GrantDenied)] == ["kit:write"]


def test_gateway_spec_round_trips_through_its_environment(tmp_path: Path) -> None:
    spec = GatewaySpec(
        agent_id="a",
        task_id="t",
        mcp_config=tmp_path / "m.yaml",
        call_log=tmp_path / "calls.jsonl",
        grants=("hub:*",),
        denied_grants=("hub:admin",),
        allowed_tools=("hub__search_posts",),
        servers=("hub",),
        strict_grants=True,
        deadline_epoch_s=1234.5,
        secrets_file=tmp_path / "s.json",
        workdir=tmp_path,
    )
    assert GatewaySpec.from_environment(spec.environment()) == spec
    assert all(" " not in value for value in spec.environment().values())
    with pytest.raises(ValueError, match="GATEWAY_TASK_ID is not set"):
        GatewaySpec.from_environment({"GATEWAY_AGENT_ID": "a"})


def test_call_log_reader_leaves_a_partial_line_for_later(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text('{"event": "gateway_started", "pid": 42}\n{"event": "server_sp')
    activity, offset = read_call_log(path)
    assert activity.gateway_pids == [42]
    with path.open("a") as file:
        file.write('awned", "pid": 43}\n')
    more, _ = read_call_log(path, offset=offset)
    assert more.server_pids == [43]


# --- agent-worker executors ----------------------------------------------------------------


def test_listing_says_what_is_installed_and_who_gets_tools(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("claude", "opencode", "aider"):
        install_fake_cli(name, bin_dir)
    monkeypatch.setenv("PATH", str(bin_dir))  # only the fakes: a real CLI cannot interfere
    assert list_executors(["--json"]) == 0
    listed = {entry["type"]: entry for entry in json.loads(capsys.readouterr().out)}

    assert listed["claude-code"]["installed"] is True
    assert listed["claude-code"]["version"] == "2.1.197 (Claude Code)"
    assert listed["claude-code"]["supports_tools"] is True
    assert listed["aider"]["supports_tools"] is False
    assert listed["aider"]["tools"] == "no tool calling: agents answer without tools"
    assert listed["goose"]["installed"] is False
    assert listed["goose"]["version"] is None
    assert listed["native"]["installed"] is True

    # What the sandbox mounts for a CLI: its file and interpreter, never its directory.
    mounts = listed["claude-code"]["mounts"]
    assert str(bin_dir / "claude") in mounts and str(bin_dir) not in mounts
    assert os.path.realpath(sys.executable) in mounts
    assert listed["goose"]["mounts"] is None
    assert listed["goose"]["install_command"].startswith(
        "curl -fsSL https://github.com/block/goose"
    )

    assert list_executors([]) == 0
    table = capsys.readouterr().out
    assert "goose" in table and "not installed" in table
    assert f"claude-code: runs {bin_dir / 'claude'}" in table
    assert "opencode: runs" in table and "mounts for it, beyond the above:" in table
    assert "aider: runs" in table and "install with `pipx install aider-chat`" not in table


def test_listing_runs_version_in_a_scratch_home(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install_fake_cli("opencode", bin_dir)
    set_scenario(fake, {})
    monkeypatch.setenv("PATH", str(bin_dir))  # only the fakes: a real CLI cannot interfere
    list_executors(["--json"])
    env = read_record(fake)["env"]
    assert env["HOME"] != os.environ.get("HOME")
    assert "HUB_API_KEY" not in env
