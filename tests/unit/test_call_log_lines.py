"""One log observer writes the per-call lines (``llm_call``, ``tool_call``,
``grant_denied``) of a run, whether the native loop or a CLI executor ran it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_runs import executor, make_agent, make_request
from tests.support.cli_runs import worker_secrets as worker_secrets  # an autouse fixture
from tests.support.fake_clis import install_fake_cli
from worker import logs
from worker.loop import GrantDenied, LlmCalled, ToolCalled, log_observer
from worker.models import StopReason, Usage

# Present on every line: ts, level, event.
ENVELOPE = {"ts", "level", "event"}
NATIVE_FIELDS = {
    "llm_call": {
        "task",
        "agent",
        "step",
        "provider",
        "model",
        "status",
        "tokens_input",
        "tokens_output",
        "tokens_cache_read",
        "tokens_cache_write",
        "stop_reason",
        "duration_ms",
    },
    "tool_call": {"task", "agent", "step", "tool", "server", "outcome", "duration_ms"},
    "grant_denied": {"task", "agent", "tool", "required_grant", "reason", "strict"},
}


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.set_stream(stream)
    try:
        yield stream
    finally:
        logs.set_stream(None)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def observe_one_of_each(executor_name: str | None) -> None:
    observe = log_observer(task_id="t-1", agent_id="agent-a", executor=executor_name)
    observe(
        LlmCalled(
            step=1,
            provider="openai",
            model="m",
            status="ok",
            usage=Usage(input_tokens=12, output_tokens=3),
            duration_s=0.01234,
            stop_reason=StopReason.TOOL_USE,
        )
    )
    observe(ToolCalled(step=1, tool="hub__get_thread", server="hub", outcome="ok", duration_s=0.5))
    observe(GrantDenied(step=1, tool="hub__create_post", required_grant="hub:write", strict=True))


def test_native_lines_carry_the_fields_they_always_had(log_stream: io.StringIO) -> None:
    observe_one_of_each(None)

    lines = lines_of(log_stream)
    assert {line["event"]: set(line) - ENVELOPE for line in lines} == NATIVE_FIELDS
    llm, tool, denied = lines
    assert (llm["tokens_input"], llm["stop_reason"], llm["duration_ms"]) == (12, "tool_use", 12.34)
    assert (tool["server"], tool["outcome"], tool["duration_ms"]) == ("hub", "ok", 500.0)
    assert (denied["level"], denied["required_grant"], denied["reason"], denied["strict"]) == (
        "warning",
        "hub:write",
        "missing_grant",
        True,
    )


def test_cli_lines_are_the_native_lines_plus_the_executor(log_stream: io.StringIO) -> None:
    observe_one_of_each("claude-code")

    lines = lines_of(log_stream)
    assert {line["event"]: set(line) - ENVELOPE for line in lines} == {
        event: fields | {"executor"} for event, fields in NATIVE_FIELDS.items()
    }
    assert {line["executor"] for line in lines} == {"claude-code"}


@pytest.mark.anyio
async def test_a_cli_run_logs_its_model_calls_as_a_native_run_does(
    tmp_path: Path, log_stream: io.StringIO, worker_secrets: None
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = install_fake_cli("claude", bin_dir)

    result = await executor("claude-code", fake).run(make_request(make_agent("claude-code")))

    assert result.error is None, result.error
    llm_calls = [line for line in lines_of(log_stream) if line["event"] == "llm_call"]
    assert len(llm_calls) == result.state.iterations >= 1
    assert {(c["task"], c["agent"], c["executor"], c["model"]) for c in llm_calls} == {
        ("t-cli-1", "cli-agent", "claude-code", "claude-sonnet-4-5")
    }
