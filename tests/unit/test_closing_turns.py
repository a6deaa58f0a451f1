"""Closing instead of failing: the loop's tool-less closing turn, repeated reads, model quirks.

Driven by ScriptedModel and in-process tools; ``Rules`` stands in for the task's CallRules
(the pipeline's, tested in test_jobs, says which writes deliver the answer).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.loop import (
    AgentLoop,
    Closing,
    LoopSettings,
    RunLimits,
    RunResult,
    ToolCallRecord,
    ToolOutcome,
)
from worker.loop._limits import FALLBACK_ANSWER
from worker.loop._output import is_announcement, is_retold_call
from worker.models import Message
from worker.models._scripted import ScriptedModel, Turn
from worker.task import Outcome
from worker.tools import LocalToolbox, ToolResult
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

REPLY = "Run one `rq worker agents` per core; the queue hands each task to one worker."


class Rules:
    """``post`` delivers the answer, ``capped`` is refused by a write cap; ``lookup`` reads."""

    def read_only(self, tool: str) -> bool:
        return tool == "lookup"

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        if record.name == "capped" and record.outcome is ToolOutcome.REFUSED:
            return Closing(reason="The write was not made: daily comment limit (1) reached.")
        if record.name == "post" and record.outcome is ToolOutcome.OK:
            return Closing(
                reason="Your reply is posted.", delivered=json.loads(record.arguments)["text"]
            )
        return None


def toolbox() -> LocalToolbox:
    def lookup(topic: str) -> str:
        return f"notes on {topic}"

    def post(text: str) -> str:
        return "Created comment c-1 on post p-1."

    class CappedBox(LocalToolbox):
        async def call(self, name: str, arguments: dict[str, Any], ctx: Any) -> ToolResult:
            if name == "capped":
                self.calls.append((name, arguments))
                return ToolResult(
                    content="Error: daily comment limit (1) reached", is_error=True, refused=True
                )
            return await super().call(name, arguments, ctx)

    return CappedBox(
        [
            LocalTool(name="lookup", function=lookup),
            LocalTool(name="post", function=post),
            LocalTool(name="capped", function=post),
        ]
    )


async def run(turns: list[Turn], **settings: Any) -> tuple[RunResult, ScriptedModel, LocalToolbox]:
    model = ScriptedModel(turns)
    box = toolbox()
    loop = AgentLoop(
        model=model,
        toolbox=box,
        system="You are a test agent.",
        settings=LoopSettings(call_rules=Rules(), **settings),
        task_id="t-1",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="How do I scale workers?")])
    return result, model, box


# --- closing instead of failing -----------------------------------------------------------


async def test_a_delivered_reply_closes_the_run_with_a_tool_less_turn() -> None:
    result, model, box = await run(
        [Turn(tool_calls=[("post", {"text": REPLY})]), Turn(text="I answered on the thread.")]
    )
    assert result.outcome is Outcome.COMPLETED and result.output == "I answered on the thread."
    closing = model.requests[-1]
    assert not closing.tools_callable and "Do not call any tool" in closing.messages[-1].content
    assert box.calls == [("post", {"text": REPLY})]


async def test_a_delivered_reply_completes_the_run_when_the_closing_turn_writes_no_answer() -> None:
    # The closing turn of a weak model: it calls the write tool again (dropped: no tools).
    result, _, box = await run(
        [Turn(tool_calls=[("post", {"text": REPLY})]), Turn(tool_calls=[("post", {"text": REPLY})])]
    )
    assert result.outcome is Outcome.COMPLETED and result.output == REPLY
    assert len(box.calls) == 1


async def test_calls_after_the_delivered_reply_in_the_same_step_do_not_run() -> None:
    turns = [
        Turn(tool_calls=[("post", {"text": REPLY}), ("post", {"text": "again"})]),
        Turn(text="Done."),
    ]
    result, _, box = await run(turns)
    assert box.calls == [("post", {"text": REPLY})]
    [step] = [s for s in result.steps if s.tool_calls]
    assert [c.outcome for c in step.tool_calls] == [ToolOutcome.OK, ToolOutcome.REFUSED]
    assert step.tool_calls[1].content.startswith("Error: not run: the task is closing")


async def test_a_write_refused_by_a_cap_closes_the_run() -> None:
    result, model, _ = await run([Turn(tool_calls=[("capped", {"text": REPLY})]), Turn(text=REPLY)])
    assert result.outcome is Outcome.COMPLETED and result.output == REPLY
    assert "daily comment limit (1) reached" in model.requests[-1].messages[-1].content
    assert result.steps[0].tool_calls[0].outcome is ToolOutcome.REFUSED


async def test_a_loop_guard_closes_and_its_answer_completes_the_run() -> None:
    turns = [Turn(tool_calls=[("lookup", {"topic": "rq"})]) for _ in range(4)]
    turns.append(Turn(text=REPLY))
    result, model, box = await run(turns, max_same_call_repeats=3)
    assert result.outcome is Outcome.COMPLETED and result.output == REPLY
    assert len(box.calls) == 1  # the repeats were answered from the first result
    assert (
        "called with the same arguments more than 3 times"
        in model.requests[-1].messages[-1].content
    )


async def test_a_loop_guard_without_a_closing_answer_is_a_tool_loop() -> None:
    turns = [Turn(tool_calls=[("lookup", {"topic": "rq"})]) for _ in range(5)]
    result, _, _ = await run(turns, max_same_call_repeats=3)
    assert result.outcome is Outcome.TOOL_LOOP
    # Every call the model made got a result, so the closing request was well formed.
    assert all(not step.pending_calls for step in result.steps)


# What Qwen2.5-Coder 0.5B answered a retold closing turn in ``make eval`` (2026-11-26): the
# worker's own words back, which are not an answer to post.
ECHOED_REASON = (
    "Based on the information provided in the thread, the worker stopped your tool calls: "
    "tool 'lookup' called with the same arguments more than 3 times."
)


async def test_a_closing_turn_that_repeats_the_workers_words_is_no_answer() -> None:
    turns = [Turn(tool_calls=[("lookup", {"topic": "rq"})]) for _ in range(4)]
    turns += [Turn(text=ECHOED_REASON), Turn(text=ECHOED_REASON)]
    result, model, _ = await run(turns, max_same_call_repeats=3)
    assert result.outcome is Outcome.TOOL_LOOP and result.output == ""
    # The first echo was asked again, retold; the second ended the run without an answer.
    assert len(model.requests) == 6 and not model.requests[-1].tools


async def test_an_echo_then_an_answer_completes_the_run_with_the_answer() -> None:
    turns = [Turn(tool_calls=[("lookup", {"topic": "rq"})]) for _ in range(4)]
    turns += [Turn(text=ECHOED_REASON), Turn(text=REPLY)]
    result, _, _ = await run(turns, max_same_call_repeats=3)
    assert result.outcome is Outcome.COMPLETED and result.output == REPLY


# --- repeated reads -----------------------------------------------------------------------


async def test_a_repeated_read_gets_the_earlier_result_with_a_note() -> None:
    turns = [
        Turn(tool_calls=[("lookup", {"topic": "rq"})]),
        Turn(tool_calls=[("lookup", {"topic": "rq"})]),
        Turn(text=REPLY),
    ]
    result, model, box = await run(turns)
    assert box.calls == [("lookup", {"topic": "rq"})]
    repeat = result.steps[1].tool_calls[0]
    assert repeat.outcome is ToolOutcome.OK and repeat.content == "notes on rq"
    # The note is the worker's own message, after the (untrusted) tool result.
    tool_result, note = model.requests[2].messages[-2:]
    assert tool_result.role == "tool" and note.role == "user"
    assert note.content == (
        "Your call to lookup is the same as in step 1, so it was not run again: its result "
        "is the same as then. Answer now."  # no other read tool to name
    )
    assert result.outcome is Outcome.COMPLETED


async def test_a_repeated_write_is_not_answered_from_memory() -> None:
    turns = [Turn(tool_calls=[("capped", {"text": "a"})]), Turn(text=REPLY)]
    result, _, box = await run(turns)
    assert not Rules().read_only("capped") and box.calls == [("capped", {"text": "a"})]
    assert result.outcome is Outcome.COMPLETED


# --- model quirks -------------------------------------------------------------------------


async def test_a_call_left_in_a_json_fence_is_run() -> None:
    fenced = '```json\n{"name": "lookup", "arguments": {"topic": "rq"}}\n```'
    result, _, box = await run([Turn(text=fenced), Turn(text=REPLY)])
    assert box.calls == [("lookup", {"topic": "rq"})]
    assert result.output == REPLY and result.steps[0].text == ""


async def test_a_call_in_tool_call_tags_is_run() -> None:
    tagged = '<tool_call>\n{"name": "lookup", "arguments": {"topic": "redis"}}\n</tool_call>'
    _, _, box = await run([Turn(text=tagged), Turn(text=REPLY)])
    assert box.calls == [("lookup", {"topic": "redis"})]


async def test_an_announcement_alone_is_never_the_answer() -> None:
    result, model, _ = await run([Turn(text="Let me look that up for you."), Turn(text=REPLY)])
    assert result.outcome is Outcome.COMPLETED and result.output == REPLY
    assert not model.requests[-1].tools_callable


async def test_an_announcement_in_the_closing_turn_leaves_no_answer_to_post() -> None:
    result, _, _ = await run([Turn(text="Let me check."), Turn(text="I'll look it up now.")])
    assert result.outcome is Outcome.COMPLETED and result.output == ""


async def test_an_imitated_call_in_a_wind_down_is_not_the_answer() -> None:
    turns = [Turn(tool_calls=[("lookup", {"topic": str(n)})]) for n in range(2)]
    turns.append(Turn(text='```json\n{"name": "lookup", "arguments": {"topic": "x"}}\n```'))
    result, _, _ = await run(turns, limits=RunLimits(max_iterations=2))
    assert result.outcome is Outcome.MAX_ITERATIONS
    assert result.fallback and result.output == FALLBACK_ANSWER.format(limit="max_iterations")


@pytest.mark.parametrize(
    ("text", "announces"),
    [
        ("I'll fetch the page now.", True),
        ("Let me check the feed first.", True),
        ("Checking the logs:", True),
        ("I will not share credentials or post elsewhere.", False),
        ("I'll never post your token anywhere.", False),
        ("Looking at the logs, the disk is full.", False),
        ("The pod restarted because its memory limit is 256 MiB.", False),
    ],
)
def test_an_announcement_is_work_to_come_never_a_refusal(text: str, announces: bool) -> None:
    assert is_announcement(text) is announces


@pytest.mark.parametrize(
    ("text", "retold"),
    [
        ('(I called hub__search_posts with {"query": "redis"})', True),
        ("I called get_feed with {}\n(I called get_thread with {})", True),
        ("You called hub__get_thread with {}.", True),
        ("I called the maintainers and they confirmed the port is 6379.", False),
        ("I called get_feed with {} and the feed holds one question: the port is 6379.", False),
        ("The default port is 6379.", False),
    ],
)
def test_a_retelling_of_the_calls_is_no_answer(text: str, retold: bool) -> None:
    assert is_retold_call(text) is retold


async def test_a_closing_turn_that_only_retells_a_call_is_asked_again_retold() -> None:
    calls = [Turn(tool_calls=[("lookup", {"topic": str(n)})]) for n in range(2)]
    restated = Turn(text='(I called lookup with {"topic": "1"})')
    result, model, _ = await run(
        [*calls, restated, Turn(text=REPLY)], limits=RunLimits(max_iterations=2)
    )
    assert result.outcome is Outcome.MAX_ITERATIONS and result.output == REPLY
    retold = model.requests[-1].messages
    assert all(message.role != "tool" and not message.tool_calls for message in retold)
    assert 'You called lookup with {"topic": "1"}. Result:' in retold[-1].content


async def test_only_the_closing_call_is_the_runs_last_and_tools_go_sorted_by_name() -> None:
    # The closing call's conversation is never sent again (a prompt cache need not keep it);
    # every call offers the tools in one order, whatever order the toolbox listed them in.
    _, model, _ = await run(
        [
            Turn(tool_calls=[("lookup", {"topic": "rq"})]),
            Turn(tool_calls=[("post", {"text": REPLY})]),
            Turn(text="I answered on the thread."),
        ]
    )
    assert [request.last_call for request in model.requests] == [False, False, True]
    assert [tool.name for tool in model.requests[0].tools] == ["capped", "lookup", "post"]


async def test_a_call_offered_no_tool_is_the_runs_last() -> None:
    model = ScriptedModel([Turn(text=REPLY)])
    loop = AgentLoop(
        model=model,
        toolbox=LocalToolbox([]),
        system="You are a test agent.",
        settings=LoopSettings(),
        task_id="t-1",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="How do I scale workers?")])
    assert result.outcome is Outcome.COMPLETED
    assert [request.last_call for request in model.requests] == [True]
