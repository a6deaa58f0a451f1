"""One test per loop rule of docs/contract.md, driven by ScriptedModel and in-process tools."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from worker import logs
from worker.exceptions import ModelAuthError, ModelUnavailable, ToolFailed
from worker.loop import (
    AgentLoop,
    Control,
    EventBus,
    LlmCalled,
    LoopEvent,
    LoopSettings,
    RunLimits,
    RunResult,
    StepFinished,
    StepStarted,
    ToolCalled,
    observing,
)
from worker.loop._limits import FALLBACK_ANSWER
from worker.loop._state import MemoryJournal
from worker.models import Message, ModelRequest, StopReason
from worker.models._scripted import ScriptedModel, Turn
from worker.task import Outcome
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

NUMBER_SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def make_toolbox(**extra: Any) -> LocalToolbox:
    def double(n: int) -> str:
        return str(n * 2)

    def explode(n: int) -> str:
        raise RuntimeError("disk on fire")

    async def hang(n: int) -> str:
        await anyio.sleep(30)
        return "never"

    def big(n: int) -> str:
        return "x" * n

    tools = [
        LocalTool(name="double", function=double, input_schema=NUMBER_SCHEMA),
        LocalTool(name="explode", function=explode, input_schema=NUMBER_SCHEMA),
        LocalTool(name="hang", function=hang, input_schema=NUMBER_SCHEMA),
        LocalTool(name="big", function=big, input_schema=NUMBER_SCHEMA),
        LocalTool(
            name="admin", function=double, input_schema=NUMBER_SCHEMA, required_grant="admin:write"
        ),
    ]
    return LocalToolbox(tools, grants=extra.get("grants", set()), strict=extra.get("strict", False))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedControl:
    def __init__(self, controls: Sequence[Control]) -> None:
        self._controls = list(controls)

    async def poll(self) -> Control:
        return self._controls.pop(0) if self._controls else Control()


async def run(
    turns: list[Any],
    *,
    toolbox: LocalToolbox | None = None,
    settings: LoopSettings | None = None,
    **kwargs: Any,
) -> tuple[RunResult, ScriptedModel, LocalToolbox]:
    model = ScriptedModel(turns)
    box = toolbox or make_toolbox()
    loop = AgentLoop(
        model=model,
        toolbox=box,
        system="You are a test agent.",
        settings=settings or LoopSettings(),
        task_id="t-1",
        agent_id="test-agent",
        **kwargs,
    )
    result = await loop.run([Message(role="user", content="go")])
    return result, model, box


def tool_messages(result: RunResult) -> list[Message]:
    return [m for m in result.messages if m.role == "tool"]


# --- final answer ------------------------------------------------------------------------


async def test_answer_without_tool_calls_completes() -> None:
    result, model, _ = await run([Turn(text="All done.")])
    assert result.outcome is Outcome.COMPLETED
    assert result.output == "All done."
    assert result.state.llm_calls == 1
    assert len(model.requests) == 1


async def test_tool_call_result_is_observed_by_the_next_call() -> None:
    result, model, box = await run(
        [Turn(tool_calls=[("double", {"n": 21})]), Turn(text="It is 42.")]
    )
    assert result.outcome is Outcome.COMPLETED
    assert box.calls == [("double", {"n": 21})]
    second = model.requests[1]
    assert second.messages[-1].role == "tool" and second.messages[-1].content == "42"
    assert result.state.tool_calls == 1 and result.state.iterations == 2


# --- limits --------------------------------------------------------------------------------


async def test_max_iterations_makes_one_tool_less_final_call() -> None:
    turns = [Turn(tool_calls=[("double", {"n": i})]) for i in range(3)]
    turns.append(Turn(text="Best effort answer."))
    settings = LoopSettings(limits=RunLimits(max_iterations=3))
    result, model, box = await run(turns, settings=settings)
    assert result.outcome is Outcome.MAX_ITERATIONS
    assert result.output == "Best effort answer."
    assert len(box.calls) == 3
    final_request = model.requests[-1]
    assert final_request.tools and not final_request.tools_callable
    assert "limit" in final_request.messages[-1].content
    assert result.state.iterations == 3 and result.state.llm_calls == 4
    assert result.steps[-1].final


async def test_max_iterations_boundary_allows_exactly_the_limit() -> None:
    settings = LoopSettings(limits=RunLimits(max_iterations=2))
    result, _, _ = await run(
        [Turn(tool_calls=[("double", {"n": 1})]), Turn(text="done in two")], settings=settings
    )
    assert result.outcome is Outcome.COMPLETED


async def test_max_tokens_stops_before_a_step_that_would_cross_the_limit() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=1000))
    turns = [
        Turn(tool_calls=[("double", {"n": 1})], input_tokens=300, output_tokens=100),
        Turn(text="closing answer", input_tokens=450, output_tokens=20),
    ]
    result, model, box = await run(turns, settings=settings)
    # 400 used + about 400 for the next step fits: step 2 runs normally.
    assert result.outcome is Outcome.COMPLETED
    turns = [
        Turn(tool_calls=[("double", {"n": 1})], input_tokens=450, output_tokens=100),
        Turn(text="closing answer", input_tokens=560, output_tokens=20),
    ]
    result, model, box = await run(turns, settings=settings)
    # 550 used + about 550 for the next step does not fit: wind down instead.
    assert result.outcome is Outcome.MAX_TOKENS
    assert result.output == "closing answer"
    # The tools' tokens would not fit what is left: the closing call lists none (an answer
    # matters more than a cached prefix).
    assert model.requests[-1].tools == ()
    # Its output is budgeted: the 550 used plus its estimated input and output fit the 1000.
    closing = model.requests[-1].max_output_tokens
    assert closing is not None and 32 <= closing < 450
    assert len(box.calls) == 1


async def test_max_tokens_uses_the_fallback_when_nothing_is_left() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=600))
    turns = [Turn(tool_calls=[("double", {"n": 1})], input_tokens=540, output_tokens=60)]
    result, model, _ = await run(turns, settings=settings)
    assert result.outcome is Outcome.MAX_TOKENS
    assert result.output == FALLBACK_ANSWER.format(limit="max_tokens") and result.fallback
    assert len(model.requests) == 1
    assert result.state.usage.total_tokens == 600


async def test_cost_budget_winds_down_before_a_step_that_would_cross_it() -> None:
    settings = LoopSettings(limits=RunLimits(max_cost_usd=0.10))
    turns = [
        Turn(tool_calls=[("double", {"n": 1})], cost_usd=0.03),
        Turn(tool_calls=[("double", {"n": 2})], cost_usd=0.04),
        Turn(text="cheap closing answer", cost_usd=0.001),
    ]
    result, model, box = await run(turns, settings=settings)
    # 0.07 spent + about 0.04 for the next step would cross 0.10.
    assert result.outcome is Outcome.BUDGET
    assert len(box.calls) == 2
    assert result.output == "cheap closing answer"
    assert not model.requests[-1].tools_callable
    assert result.state.usage.cost_usd == pytest.approx(0.071)


async def test_cost_budget_spent_entirely_uses_the_fallback() -> None:
    settings = LoopSettings(limits=RunLimits(max_cost_usd=0.05))
    turns = [Turn(tool_calls=[("double", {"n": 1})], cost_usd=0.05), Turn(text="unused")]
    result, model, _ = await run(turns, settings=settings)
    assert result.outcome is Outcome.BUDGET
    assert result.output == FALLBACK_ANSWER.format(limit="budget") and result.fallback
    assert len(model.requests) == 1


async def test_unknown_price_makes_cost_unknown_and_never_trips_the_budget() -> None:
    settings = LoopSettings(limits=RunLimits(max_cost_usd=0.01))
    turns = [Turn(tool_calls=[("double", {"n": 1})], cost_usd=None), Turn(text="ok")]
    result, _, _ = await run(turns, settings=settings)
    assert result.outcome is Outcome.COMPLETED
    assert result.state.usage.cost_usd is None


async def test_deadline_winds_down_with_a_final_call() -> None:
    clock = FakeClock()

    def slow_tool(n: int) -> str:
        clock.now += 95  # the tool eats almost all of the 100 s budget
        return "slow result"

    box = LocalToolbox([LocalTool(name="slow", function=slow_tool, input_schema=NUMBER_SCHEMA)])
    settings = LoopSettings(limits=RunLimits(max_duration_s=100, final_answer_reserve_s=10))
    turns = [Turn(tool_calls=[("slow", {"n": 1})]), Turn(text="closing answer")]
    result, model, _ = await run(turns, toolbox=box, settings=settings, clock=clock)
    assert result.outcome is Outcome.DEADLINE
    assert result.output == "closing answer"
    assert not model.requests[-1].tools_callable
    assert model.requests[-1].timeout_s == pytest.approx(5, abs=0.01)


async def test_every_call_gets_the_remaining_budget_as_timeout() -> None:
    clock = FakeClock()
    seen: list[float] = []

    def tick(n: int, ctx: Any) -> str:
        seen.append(ctx.timeout_s)
        clock.now += 30
        return "ok"

    box = LocalToolbox(
        [LocalTool(name="tick", function=tick, input_schema=NUMBER_SCHEMA, wants_context=True)]
    )
    settings = LoopSettings(
        limits=RunLimits(max_duration_s=100), llm_timeout_cap_s=500, tool_timeout_cap_s=500
    )
    turns = [Turn(tool_calls=[("tick", {"n": 1})]), Turn(text="done")]
    result, model, _ = await run(turns, toolbox=box, settings=settings, clock=clock)
    assert result.outcome is Outcome.COMPLETED
    # What is left, less the 10 s kept for a closing answer (a tenth of a 100 s budget).
    assert model.requests[0].timeout_s == pytest.approx(90)
    assert seen == [pytest.approx(90)]
    assert model.requests[1].timeout_s == pytest.approx(60)


async def test_call_timeout_is_capped_by_its_own_default() -> None:
    settings = LoopSettings(limits=RunLimits(max_duration_s=300), llm_timeout_cap_s=20)
    _, model, _ = await run([Turn(text="ok")], settings=settings)
    assert model.requests[0].timeout_s == pytest.approx(20)


# --- tool call errors ----------------------------------------------------------------------


async def test_unknown_tool_returns_error_and_loop_continues() -> None:
    result, _, _ = await run([Turn(tool_calls=[("nope", {})]), Turn(text="recovered")])
    assert tool_messages(result)[0].content == "Error: Unknown tool 'nope'"
    assert tool_messages(result)[0].is_error
    assert result.outcome is Outcome.COMPLETED


async def test_arguments_that_are_not_json_are_refused_without_calling() -> None:
    result, _, box = await run([Turn(tool_calls=[("double", "{n: 1")]), Turn(text="ok")])
    assert box.calls == []
    assert "not valid JSON" in tool_messages(result)[0].content


async def test_arguments_not_matching_the_schema_are_refused_without_calling() -> None:
    result, _, box = await run([Turn(tool_calls=[("double", {"n": "three"})]), Turn(text="ok")])
    assert box.calls == []
    content = tool_messages(result)[0].content
    assert content.startswith("Error: invalid arguments for tool 'double': n:")
    assert "integer" in content
    result, _, box = await run([Turn(tool_calls=[("double", "[1, 2]")]), Turn(text="ok")])
    assert "must be a JSON object" in tool_messages(result)[0].content


async def test_tool_that_raises_returns_error_and_loop_continues() -> None:
    result, _, _ = await run([Turn(tool_calls=[("explode", {"n": 1})]), Turn(text="sorry")])
    message = tool_messages(result)[0]
    assert message.is_error and "disk on fire" in message.content
    assert result.outcome is Outcome.COMPLETED


async def test_tool_failed_message_reaches_the_model() -> None:
    def down(n: int) -> str:
        raise ToolFailed("server 'web' is unavailable; its tools were withdrawn for this task")

    box = LocalToolbox([LocalTool(name="down", function=down, input_schema=NUMBER_SCHEMA)])
    result, _, _ = await run([Turn(tool_calls=[("down", {"n": 1})]), Turn(text="ok")], toolbox=box)
    assert tool_messages(result)[0].content.startswith("Error: server 'web' is unavailable")


async def test_tool_that_hangs_past_its_timeout_returns_error_and_loop_continues() -> None:
    settings = LoopSettings(tool_timeout_cap_s=0.05)
    result, _, _ = await run(
        [Turn(tool_calls=[("hang", {"n": 1})]), Turn(text="moved on")], settings=settings
    )
    message = tool_messages(result)[0]
    assert message.is_error and "timed out after 0.1 s" in message.content
    assert result.outcome is Outcome.COMPLETED


# --- grants --------------------------------------------------------------------------------


async def test_missing_grant_is_never_executed_and_reported() -> None:
    events: list[LoopEvent] = []
    result, _, box = await run(
        [Turn(tool_calls=[("admin", {"n": 1})]), Turn(text="ok")], observers=[events.append]
    )
    assert box.calls == []
    assert tool_messages(result)[0].content == "Error: Missing grant admin:write"
    assert any(type(e).__name__ == "GrantDenied" for e in events)
    assert result.outcome is Outcome.COMPLETED


async def test_missing_grant_under_strict_grants_is_an_autonomy_violation() -> None:
    result, _, box = await run(
        [Turn(tool_calls=[("admin", {"n": 1})]), Turn(text="never reached")],
        toolbox=make_toolbox(strict=True),
    )
    assert box.calls == []
    assert result.outcome is Outcome.AUTONOMY_VIOLATION
    assert result.error is not None and "admin:write" in str(result.error)


async def test_can_execute_tool_hook_refuses_before_execution() -> None:
    def only_small(name: str, arguments: dict[str, Any]) -> str | None:
        return "numbers above 10 are not allowed" if arguments.get("n", 0) > 10 else None

    result, _, box = await run(
        [Turn(tool_calls=[("double", {"n": 11}), ("double", {"n": 2})]), Turn(text="ok")],
        can_execute_tool=only_small,
    )
    assert box.calls == [("double", {"n": 2})]
    assert tool_messages(result)[0].content == "Error: numbers above 10 are not allowed"


# --- guards --------------------------------------------------------------------------------


async def test_same_call_repeated_more_than_n_times_is_a_tool_loop() -> None:
    turns = [Turn(tool_calls=[("double", {"n": 5})]) for _ in range(5)]
    settings = LoopSettings(max_same_call_repeats=3)
    result, _, box = await run(turns, settings=settings)
    assert result.outcome is Outcome.TOOL_LOOP
    assert len(box.calls) == 3  # the fourth identical call never ran


async def test_n_identical_calls_are_still_allowed() -> None:
    turns = [Turn(tool_calls=[("double", {"n": 5})]) for _ in range(3)] + [Turn(text="ok")]
    result, _, _ = await run(turns, settings=LoopSettings(max_same_call_repeats=3))
    assert result.outcome is Outcome.COMPLETED


async def test_consecutive_failed_steps_close_with_a_tool_less_turn() -> None:
    turns = [Turn(tool_calls=[("explode", {"n": i})]) for i in range(3)]
    turns.append(Turn(text="The tool is broken, so here is what I know."))
    result, model, _ = await run(turns, settings=LoopSettings(max_consecutive_error_steps=3))
    assert result.outcome is Outcome.COMPLETED
    assert result.output == "The tool is broken, so here is what I know."
    assert result.state.iterations == 3 and not model.requests[-1].tools_callable
    assert "Do not call any tool" in model.requests[-1].messages[-1].content


async def test_consecutive_failed_steps_without_a_closing_answer_are_a_tool_loop() -> None:
    turns = [Turn(tool_calls=[("explode", {"n": i})]) for i in range(3)]
    turns.append(Turn(tool_calls=[("explode", {"n": 9})]))  # still no answer when closing
    result, _, box = await run(turns, settings=LoopSettings(max_consecutive_error_steps=3))
    assert result.outcome is Outcome.TOOL_LOOP
    assert result.state.iterations == 3 and len(box.calls) == 3


async def test_a_successful_step_resets_the_failed_steps_count() -> None:
    turns = [
        Turn(tool_calls=[("explode", {"n": 1})]),
        Turn(tool_calls=[("explode", {"n": 2})]),
        Turn(tool_calls=[("double", {"n": 3})]),
        Turn(tool_calls=[("explode", {"n": 4})]),
        Turn(tool_calls=[("explode", {"n": 5})]),
        Turn(text="fine"),
    ]
    result, _, _ = await run(turns, settings=LoopSettings(max_consecutive_error_steps=3))
    assert result.outcome is Outcome.COMPLETED


# --- outputs -------------------------------------------------------------------------------


async def test_huge_tool_output_is_truncated_with_a_marker() -> None:
    settings = LoopSettings(tool_output_max_chars=1000)
    result, _, _ = await run(
        [Turn(tool_calls=[("big", {"n": 50_000})]), Turn(text="ok")], settings=settings
    )
    content = tool_messages(result)[0].content
    assert content.startswith("x" * 1000)
    assert "[truncated: 49000 of 50000 characters omitted]" in content
    assert len(content) < 1100


async def test_old_tool_outputs_beyond_the_context_budget_are_stubbed() -> None:
    turns = [Turn(tool_calls=[("big", {"n": 600 + i})]) for i in range(4)] + [Turn(text="ok")]
    settings = LoopSettings(context_budget_chars=1500, max_same_call_repeats=10)
    result, _, _ = await run(turns, settings=settings)
    contents = [m.content for m in tool_messages(result)]
    assert contents[0].startswith("[tool output of 600 characters removed")
    assert contents[-1] == "x" * 603


async def test_model_stop_reason_max_tokens_is_recorded_as_truncated() -> None:
    result, _, _ = await run([Turn(text="cut in the mid", stop_reason=StopReason.MAX_TOKENS)])
    assert result.steps[0].truncated
    assert result.steps[0].to_dict()["truncated"] is True


async def test_pointer_closing_turn_recovers_the_earlier_answer() -> None:
    turns = [
        Turn(text="The answer is 42, because of the tool.", tool_calls=[("double", {"n": 21})]),
        Turn(text="See above."),
    ]
    result, _, _ = await run(turns)
    assert result.output == "The answer is 42, because of the tool."


async def test_require_done_tool_ends_only_through_task_complete() -> None:
    turns = [
        Turn(text="I think I am done"),
        Turn(tool_calls=[("task_complete", {"answer": "Final: 42"})]),
    ]
    result, model, _ = await run(turns, settings=LoopSettings(require_done_tool=True))
    assert result.outcome is Outcome.COMPLETED
    assert result.output == "Final: 42"
    assert any(t.name == "task_complete" for t in model.requests[0].tools)
    assert "task_complete" in model.requests[1].messages[-1].content


# --- provider errors -----------------------------------------------------------------------


async def test_provider_unavailable_after_retries_keeps_the_partial_result() -> None:
    turns = [
        Turn(tool_calls=[("double", {"n": 1})]),
        Turn(error=ModelUnavailable("503 after 5 attempts", provider="openai", model="m")),
    ]
    result, _, _ = await run(turns)
    assert result.outcome is Outcome.MODEL_ERROR
    assert isinstance(result.error, ModelUnavailable)
    assert result.state.tool_calls == 1 and result.state.llm_calls == 1


async def test_auth_error_is_a_model_error() -> None:
    result, _, _ = await run([Turn(error=ModelAuthError("401", provider="openai", model="m"))])
    assert result.outcome is Outcome.MODEL_ERROR
    assert isinstance(result.error, ModelAuthError)


# --- control -------------------------------------------------------------------------------


async def test_cancel_stops_at_the_next_step_boundary() -> None:
    control = ScriptedControl([Control(), Control(cancelled=True)])
    turns = [Turn(tool_calls=[("double", {"n": 1})]), Turn(text="never")]
    result, model, _ = await run(turns, control=control)
    assert result.outcome is Outcome.CANCELLED
    assert len(model.requests) == 1


async def test_steer_text_is_appended_before_the_next_step() -> None:
    control = ScriptedControl([Control(), Control(steering=["Focus on the budget."])])
    turns = [Turn(tool_calls=[("double", {"n": 1})]), Turn(text="ok")]
    result, model, _ = await run(turns, control=control)
    last = model.requests[1].messages[-1]
    assert last.role == "user" and last.content == "Focus on the budget."
    assert result.outcome is Outcome.COMPLETED


# --- observers and logs --------------------------------------------------------------------


async def test_observer_that_raises_is_logged_and_ignored() -> None:
    seen: list[LoopEvent] = []

    def broken(event: LoopEvent) -> None:
        raise ValueError("observer bug")

    stream = io.StringIO()
    logs.set_stream(stream)
    try:
        result, _, _ = await run(
            [Turn(tool_calls=[("double", {"n": 1})]), Turn(text="ok")],
            observers=[broken, seen.append],
        )
    finally:
        logs.set_stream(None)
    assert result.outcome is Outcome.COMPLETED
    assert any(isinstance(e, ToolCalled) for e in seen)
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert "observer_failed" in events
    assert events.count("llm_call") == 2 and events.count("tool_call") == 1


async def test_an_observer_marked_for_some_events_gets_only_those_and_others_get_all() -> None:
    everything: list[LoopEvent] = []
    model_calls: list[LoopEvent] = []

    @observing(LlmCalled)
    def only_model_calls(event: LoopEvent) -> None:
        model_calls.append(event)

    result, _, _ = await run(
        [Turn(tool_calls=[("double", {"n": 1})]), Turn(text="ok")],
        observers=[only_model_calls, everything.append],
    )
    assert result.outcome is Outcome.COMPLETED
    assert [type(event) for event in model_calls] == [LlmCalled, LlmCalled]
    assert [type(event) for event in everything] == [
        StepStarted,
        LlmCalled,
        ToolCalled,
        StepFinished,
        StepStarted,
        LlmCalled,
    ]


def test_an_event_no_observer_acts_on_is_not_wanted() -> None:
    bus = EventBus([observing(LlmCalled)(lambda event: None)])
    assert bus.wants(LlmCalled) and not bus.wants(StepStarted)
    bus.add(lambda event: None)  # an unmarked observer acts on every event
    assert bus.wants(StepStarted)


# --- checkpoints ---------------------------------------------------------------------------


async def test_resume_from_journal_does_not_rerun_tools_or_reask_the_model() -> None:
    journal = MemoryJournal()
    crash = RuntimeError("worker killed")

    def crash_now(n: int) -> str:
        raise crash

    box = make_toolbox()
    box_crashing = LocalToolbox(
        [
            LocalTool(
                name="double", function=box._tools["double"].function, input_schema=NUMBER_SCHEMA
            ),
            LocalTool(name="crash", function=crash_now, input_schema=NUMBER_SCHEMA),
        ]
    )

    class Crash(BaseException):
        pass

    async def crash_call(name: str, arguments: dict[str, Any], ctx: Any) -> Any:
        if name == "crash":
            raise Crash
        return await LocalToolbox.call(box_crashing, name, arguments, ctx)

    box_crashing.call = crash_call  # type: ignore[method-assign]
    first = AgentLoop(
        model=ScriptedModel([Turn(tool_calls=[("double", {"n": 2}), ("crash", {"n": 0})])]),
        toolbox=box_crashing,
        system="s",
        settings=LoopSettings(),
        task_id="t",
        agent_id="a",
        journal=journal,
    )
    with pytest.raises(Crash):
        await first.run([Message(role="user", content="go")])
    assert [type(e).__name__ for e in journal.entries] == ["ResponseEntry", "ToolEntry"]

    resumed_box = make_toolbox()
    seen_requests: list[ModelRequest] = []

    def answer(request: ModelRequest) -> Turn:
        seen_requests.append(request)
        return Turn(text="finished after resume")

    model = ScriptedModel([answer])
    second = AgentLoop(
        model=model,
        toolbox=resumed_box,
        system="s",
        settings=LoopSettings(),
        task_id="t",
        agent_id="a",
    )
    result = await second.run([Message(role="user", content="go")], resume=journal.entries)
    assert result.outcome is Outcome.COMPLETED
    assert resumed_box.calls == []  # double already ran; crash is unknown here → error result
    assert next(m.content for m in tool_messages(result)) == "4"
    assert len(model.requests) == 1 and result.state.llm_calls == 2


async def test_a_tool_whose_schema_is_broken_still_runs_unchecked() -> None:
    def lenient(**kwargs: Any) -> str:
        return f"ran with {sorted(kwargs)}"

    broken = {"type": "object", "required": "n"}  # "required" must be a list
    box = LocalToolbox([LocalTool(name="lenient", function=lenient, input_schema=broken)])
    result, _, _ = await run([Turn(tool_calls=[("lenient", {})]), Turn(text="ok")], toolbox=box)
    assert tool_messages(result)[0].content == "ran with []"
    assert result.outcome is Outcome.COMPLETED
