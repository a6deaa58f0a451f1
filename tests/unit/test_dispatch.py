"""ToolDispatcher: every way a call ends is a typed ToolOutcome whose value the logs and
metrics carry unchanged (the ``outcome`` of ``tool_call`` and of agent_tool_calls_total)."""

from __future__ import annotations

import io
import json

import anyio
import pytest

from worker import logs
from worker.loop import (
    EventBus,
    LoopEvent,
    ToolCalled,
    ToolDispatcher,
    ToolOutcome,
    log_observer,
)
from worker.models import ToolCall
from worker.tools import LocalToolbox, NotAllowed, ToolboxWrapper
from worker.tools._base import Resolution
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

NUMBER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class OnlyAllowed(ToolboxWrapper):
    """A toolbox narrowed by a task's allowed_tools."""

    def __init__(self, inner: LocalToolbox, allowed: set[str]) -> None:
        super().__init__(inner)
        self._allowed = allowed

    def resolve(self, name: str) -> Resolution:
        resolution = self._inner.resolve(name)
        if resolution is not None and name not in self._allowed:
            return NotAllowed(name=name)
        return resolution


def toolbox() -> OnlyAllowed:
    def explode(n: int) -> str:
        raise RuntimeError("disk on fire")

    async def hang(n: int) -> str:
        await anyio.sleep(30)
        return "never"

    tools = [
        LocalTool(name="double", function=lambda n: str(2 * n), input_schema=NUMBER),
        LocalTool(name="explode", function=explode, input_schema=NUMBER),
        LocalTool(name="hang", function=hang, input_schema=NUMBER),
        LocalTool(name="hidden", function=lambda n: "x", input_schema=NUMBER),
        LocalTool(name="admin", function=lambda n: "x", input_schema=NUMBER, required_grant="a:w"),
        LocalTool(name="vetoed", function=lambda n: "x", input_schema=NUMBER),
    ]
    names = {tool.name for tool in tools} - {"hidden"}
    return OnlyAllowed(LocalToolbox(tools, grants=set()), names)


@pytest.mark.parametrize(
    ("name", "arguments", "outcome", "content"),
    [
        ("double", '{"n": 2}', ToolOutcome.OK, "4"),
        ("explode", '{"n": 2}', ToolOutcome.ERROR, "Error: tool 'explode' failed: disk on fire"),
        ("hang", '{"n": 2}', ToolOutcome.TIMEOUT, "Error: tool 'hang' timed out after 0.1 s"),
        ("nope", "{}", ToolOutcome.UNKNOWN_TOOL, "Error: Unknown tool 'nope'"),
        ("admin", '{"n": 2}', ToolOutcome.MISSING_GRANT, "Error: Missing grant a:w"),
        ("hidden", '{"n": 2}', ToolOutcome.NOT_ALLOWED, "Error: Tool 'hidden' is not allowed"),
        ("double", "{nope", ToolOutcome.INVALID_ARGUMENTS, "are not valid JSON"),
        ("double", '{"n": "two"}', ToolOutcome.INVALID_ARGUMENTS, "invalid arguments"),
        ("vetoed", '{"n": 2}', ToolOutcome.REFUSED, "Error: not today"),
    ],
)
async def test_each_way_a_call_ends_is_its_outcome_in_record_event_and_log(
    name: str, arguments: str, outcome: ToolOutcome, content: str
) -> None:
    events: list[LoopEvent] = []
    stream = io.StringIO()
    logs.set_stream(stream)
    try:
        dispatcher = ToolDispatcher(
            toolbox(),
            task_id="t-1",
            agent_id="agent-a",
            # The per-call log line comes from the run's log observer, as in the loop.
            events=EventBus([events.append, log_observer(task_id="t-1", agent_id="agent-a")]),
            max_output_chars=1000,
            can_execute_tool=lambda tool, _: "not today" if tool == "vetoed" else None,
        )
        record = await dispatcher.run(1, 1, ToolCall(id="c1", name=name, arguments=arguments), 0.1)
    finally:
        logs.set_stream(None)
    assert record.outcome is outcome
    assert record.is_error is (outcome is not ToolOutcome.OK)
    assert content in record.content
    [called] = [event for event in events if isinstance(event, ToolCalled)]
    assert called.outcome == outcome.value
    assert called.known is (outcome is not ToolOutcome.UNKNOWN_TOOL)
    [line] = [json.loads(raw) for raw in stream.getvalue().splitlines() if "tool_call" in raw]
    assert line["outcome"] == outcome.value


def test_tool_outcomes_keep_the_values_dashboards_count() -> None:
    assert {outcome.value for outcome in ToolOutcome} == {
        "ok",
        "error",
        "timeout",
        "unknown_tool",
        "missing_grant",
        "not_allowed",
        "invalid_arguments",
        "refused",
        "deadline",
    }
    assert {outcome for outcome in ToolOutcome if outcome.denied} == {
        ToolOutcome.MISSING_GRANT,
        ToolOutcome.NOT_ALLOWED,
    }
