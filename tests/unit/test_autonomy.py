"""The autonomy boundary: tools outside the task's allowed_tools or the agent's grants are not
offered, and a call to one anyway is refused, logged, counted, and under strict grants ends
the task; the operator's CAN_EXECUTE_TOOL check runs before every call; metric labels stay
bounded whatever names the model or the task make up."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fakeredis
import pytest

from tests.support import tool_checks
from tests.support.definitions import SHIPPED_DEMO_AGENTS
from tests.support.pipeline import in_process_hub, task_runtime
from worker import logs
from worker.exceptions import ConfigurationError
from worker.executors._gateway_link import GatewaySpec
from worker.jobs import execute_task, metrics_observer
from worker.loop import AgentLoop, CanExecuteTool, LoopSettings, RunResult
from worker.metrics import JobMetrics
from worker.metrics._recorders import WorkerMetrics
from worker.models import Message, ToolSpec
from worker.models._scripted import ScriptedModel, Turn
from worker.settings import load_settings
from worker.task import Outcome
from worker.tools import LocalToolbox, NotAllowed, ToolboxWrapper
from worker.tools._base import Resolution
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

NUMBER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class AllowedToolsToolbox(ToolboxWrapper):
    """A toolbox narrowed by a task's allowed_tools, as McpToolbox narrows it."""

    def __init__(self, inner: LocalToolbox, allowed: set[str], *, strict: bool = False) -> None:
        super().__init__(inner)
        self._allowed = allowed
        self._strict = strict

    def offered(self) -> Sequence[ToolSpec]:
        return [spec for spec in self._inner.offered() if spec.name in self._allowed]

    def resolve(self, name: str) -> Resolution:
        resolution = self._inner.resolve(name)
        if resolution is not None and name not in self._allowed:
            return NotAllowed(name=name, strict=self._strict)
        return resolution


def tools(*, strict: bool = False) -> LocalToolbox:
    return LocalToolbox(
        [
            LocalTool(name="double", function=lambda n: str(2 * n), input_schema=NUMBER),
            LocalTool(name="read", function=lambda n: "read", input_schema=NUMBER),
            LocalTool(
                name="admin", function=lambda n: "x", input_schema=NUMBER, required_grant="a:w"
            ),
        ],
        grants=set(),
        strict=strict,
    )


LogLines = Callable[[str], list[dict[str, Any]]]


@pytest.fixture
def log_lines() -> Iterator[LogLines]:
    """The JSON log lines of one event so far."""
    stream = io.StringIO()
    logs.set_stream(stream)

    def of(event: str) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        return [line for line in lines if line["event"] == event]

    try:
        yield of
    finally:
        logs.set_stream(None)


async def run(
    turns: list[Turn],
    toolbox: Any,
    *,
    metrics: JobMetrics | None = None,
    can_execute_tool: CanExecuteTool | None = None,
) -> tuple[RunResult, ScriptedModel]:
    model = ScriptedModel(turns)
    loop = AgentLoop(
        model=model,
        toolbox=toolbox,
        system="s",
        settings=LoopSettings(),
        task_id="t-1",
        agent_id="agent-a",
        observers=[metrics_observer(metrics or JobMetrics(), "agent-a")],
        can_execute_tool=can_execute_tool,
    )
    return await loop.run([Message(role="user", content="go")]), model


def series(metrics: JobMetrics, name: str) -> dict[tuple[str, ...], float]:
    target = WorkerMetrics()
    metrics.apply_locally(target)
    found: dict[tuple[str, ...], float] = {}
    for family in target.registry.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


def tool_results(model: ScriptedModel) -> list[str]:
    return [m.content for m in model.requests[-1].messages if m.role == "tool"]


# --- allowed_tools ---------------------------------------------------------------------------


async def test_a_tool_outside_allowed_tools_is_not_offered_and_refused_when_called(
    log_lines: LogLines,
) -> None:
    box = AllowedToolsToolbox(tools(), allowed={"read"})
    metrics = JobMetrics()
    result, model = await run(
        [Turn(tool_calls=[("double", {"n": 2})]), Turn(text="ok")], box, metrics=metrics
    )
    assert [t.name for t in model.requests[0].tools] == ["read"]
    assert result.outcome is Outcome.COMPLETED
    assert tool_results(model) == ["Error: Tool 'double' is not allowed in this task"]
    assert result.steps[0].tool_calls[0].outcome == "not_allowed"
    [denied] = log_lines("grant_denied")
    assert (denied["tool"], denied["reason"], denied["agent"]) == (
        "double",
        "not_allowed",
        "agent-a",
    )
    assert series(metrics, "agent_grant_denials_total") == {("agent-a", "double"): 1.0}


async def test_under_strict_grants_a_call_outside_allowed_tools_ends_the_task() -> None:
    box = AllowedToolsToolbox(tools(strict=True), allowed={"read"}, strict=True)
    result, model = await run([Turn(tool_calls=[("double", {"n": 2})]), Turn(text="never")], box)
    assert result.outcome is Outcome.AUTONOMY_VIOLATION
    assert "outside the task's allowed_tools" in result.detail
    assert len(model.requests) == 1


async def test_a_missing_grant_is_refused_and_under_strict_grants_ends_the_task(
    log_lines: LogLines,
) -> None:
    _, model = await run([Turn(tool_calls=[("admin", {"n": 1})]), Turn(text="ok")], tools())
    assert "admin" not in [t.name for t in model.requests[0].tools]
    assert tool_results(model) == ["Error: Missing grant a:w"]
    [denied] = log_lines("grant_denied")
    assert (denied["reason"], denied["required_grant"]) == ("missing_grant", "a:w")
    strict, _ = await run([Turn(tool_calls=[("admin", {"n": 1})])], tools(strict=True))
    assert strict.outcome is Outcome.AUTONOMY_VIOLATION


# --- CAN_EXECUTE_TOOL ------------------------------------------------------------------------


async def test_the_operator_check_refuses_a_call_before_it_runs() -> None:
    box = tools()
    result, model = await run(
        [Turn(tool_calls=[("double", {"n": 2}), ("read", {"n": 1})]), Turn(text="ok")],
        box,
        can_execute_tool=tool_checks.refuse_writes,
    )
    assert box.calls == [("read", {"n": 1})]
    assert tool_results(model) == ["Error: policy: double is read-only today", "read"]
    assert [c.outcome for c in result.steps[0].tool_calls] == ["refused", "ok"]


@pytest.mark.parametrize(
    ("check", "runs"),
    [
        (tool_checks.allow_everything, True),  # async, True: allowed
        (tool_checks.deny_by_false, False),
        (tool_checks.broken, False),  # a check that raises refuses (fails closed)
    ],
)
async def test_the_operator_check_fails_closed(
    check: CanExecuteTool, runs: bool, log_lines: LogLines
) -> None:
    box = tools()
    await run([Turn(tool_calls=[("read", {"n": 1})]), Turn(text="ok")], box, can_execute_tool=check)
    assert box.calls == ([("read", {"n": 1})] if runs else [])
    failed = log_lines("can_execute_tool_failed")
    assert len(failed) == (1 if check is tool_checks.broken else 0)


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("no-colon", "must be an import path like package.module:function"),
        ("tests.support.nowhere:check", "cannot import module 'tests.support.nowhere'"),
        ("tests.support.tool_checks:missing", "has no attribute 'missing'"),
        ("tests.support.tool_checks:NOT_CALLABLE", "is not callable"),
        ("tests.support.tool_checks:takes_nothing", "must accept (tool_name, arguments)"),
    ],
)
def test_a_bad_can_execute_tool_fails_at_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, path: str, problem: str
) -> None:
    monkeypatch.setenv("CAN_EXECUTE_TOOL", path)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    assert raised.value.message.startswith("invalid setting CAN_EXECUTE_TOOL: ")
    assert problem in raised.value.message


def test_can_execute_tool_reaches_the_gateway_of_cli_executors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from mcp_servers.gateway import tool_check

    monkeypatch.setenv("CAN_EXECUTE_TOOL", "tests.support.tool_checks:refuse_writes")
    path = load_settings().can_execute_tool
    spec = GatewaySpec(
        agent_id="a",
        task_id="t",
        mcp_config=tmp_path / "mcp.yaml",
        call_log=tmp_path / "calls.jsonl",
        grants=(),
        deadline_epoch_s=0.0,
        can_execute_tool=path,
    )
    received = GatewaySpec.from_environment(spec.environment())
    assert tool_check(received) is tool_checks.refuse_writes
    broken = GatewaySpec.from_environment({**spec.environment(), "GATEWAY_CAN_EXECUTE_TOOL": "x"})
    with pytest.raises(ValueError, match="CAN_EXECUTE_TOOL 'x'"):
        tool_check(broken)


# --- bounded metric labels -------------------------------------------------------------------


async def test_a_model_inventing_a_thousand_tool_names_adds_one_series() -> None:
    metrics = JobMetrics()
    invented: list[tuple[str, dict[str, Any] | str]] = [
        (f"made_up_{n}", {"n": n}) for n in range(1_000)
    ]
    result, model = await run(
        [Turn(tool_calls=invented), Turn(text="ok")], tools(), metrics=metrics
    )
    assert result.state.tool_calls == 1_000
    assert tool_results(model)[0] == "Error: Unknown tool 'made_up_0'"
    assert series(metrics, "agent_tool_calls_total") == {("none", "other", "unknown_tool"): 1000}


def test_the_worker_caps_distinct_values_of_free_form_labels() -> None:
    # A backstop for names no job process could vouch for (a wildcard server's tools).
    target = WorkerMetrics()
    batch = {
        "counters": [
            ["agent_grant_denials_total", ["agent-a", f"junk__tool_{n}"], 1] for n in range(2_000)
        ]
    }
    target.apply(batch)
    values = [
        sample.labels["tool"]
        for family in target.registry.collect()
        for sample in family.samples
        if sample.name == "agent_grant_denials_total"
    ]
    assert len(values) <= 257 and "other" in values


async def test_invalid_tasks_count_under_one_agent_and_type_label(
    redis: fakeredis.FakeRedis,
) -> None:
    key = "hub-key-for-labels-0123"
    metrics = JobMetrics()
    async with in_process_hub(key) as hub:
        runtime = task_runtime(
            hub,
            redis,
            ScriptedModel([]),
            agents_dir=SHIPPED_DEMO_AGENTS,
            api_key=key,
            metrics=metrics,
        )
        for n in range(20):
            ghost = {"task_id": f"g-{n}", "type": "exploration", "agent_id": f"ghost-{n}"}
            garbage = {"task_id": f"x-{n}", "type": f"kind-{n}", "agent_id": f"junk-{n}"}
            for task in (ghost, garbage):
                verdict = await execute_task(task, runtime)
                assert verdict.report.outcome is Outcome.INVALID_TASK
    assert series(metrics, "agent_tasks_total") == {
        ("invalid", "exploration", "invalid_task"): 20,
        ("invalid", "invalid", "invalid_task"): 20,
    }
