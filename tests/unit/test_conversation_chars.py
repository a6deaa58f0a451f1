"""The request's size is counted as the conversation grows, not recounted before each call:
after the compactor's and the window fit's in-place cuts the count is still the full one."""

from __future__ import annotations

import pytest

from worker.loop import AgentLoop, LoopSettings, RunLimits
from worker.loop._budget import ConversationChars, InputEstimator, message_chars
from worker.models import Message, ModelRequest, ModelResponse, ToolCall
from worker.models._scripted import ScriptedModel, Turn
from worker.models._types import ModelWrapper
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

WINDOW = 2048
UNBOUNDED_OUTPUT = 100_000


def full_count(messages: list[Message]) -> int:
    return sum(message_chars(message) for message in messages)


def test_the_count_follows_appends_reported_changes_and_another_list() -> None:
    conversation = ConversationChars()
    messages = [Message(role="user", content="hello")]
    assert conversation.of(messages) == 5
    messages.append(
        Message(
            role="assistant", content="", tool_calls=(ToolCall(id="1", name="f", arguments="{}"),)
        )
    )
    messages.append(Message(role="tool", content="x" * 100, tool_call_id="1"))
    assert conversation.of(messages) == full_count(messages) == 108
    messages[2].content = "stub"
    conversation.changed(messages, 2)
    assert conversation.of(messages) == full_count(messages) == 12
    # A change to a message not counted yet is counted when it is.
    messages.append(Message(role="tool", content="y" * 50, tool_call_id="2"))
    messages[3].content = "yy"
    conversation.changed(messages, 3)
    assert conversation.of(messages) == full_count(messages) == 14
    other = [Message(role="user", content="another run")]
    assert conversation.of(other) == 11
    assert conversation.of(messages[:2]) == full_count(messages[:2])


class CheckedModel(ModelWrapper):
    """Checks, at each call, the output the loop granted against a fresh count of the
    request: with a window and no other bound, it is what the window leaves."""

    def __init__(self, inner: ScriptedModel) -> None:
        super().__init__(inner)
        self.granted: list[tuple[int | None, int]] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        fresh = InputEstimator()
        chars = fresh.request_chars(request.system, request.messages, request.tools)
        expected = min(UNBOUNDED_OUTPUT, WINDOW - fresh.estimate(chars, len(request.messages)))
        self.granted.append((request.max_output_tokens, expected))
        return await self._inner.complete(request)


async def test_after_compaction_and_window_cuts_each_call_is_budgeted_on_the_full_count() -> None:
    def page(n: int) -> str:
        return f"page {n}: " + "lorem ipsum dolor sit amet " * 60  # ~1,600 characters

    turns = [Turn(tool_calls=[("page", {"n": n})], input_tokens=1) for n in range(8)]
    turns.append(Turn(text="The pages are all lorem ipsum.", input_tokens=1))
    scripted = ScriptedModel(turns)
    model = CheckedModel(scripted)
    loop = AgentLoop(
        model=model,
        toolbox=LocalToolbox([LocalTool(name="page", function=page)]),
        system="You are a test agent.",
        settings=LoopSettings(
            context_window_tokens=WINDOW,
            context_budget_chars=4_000,
            max_output_tokens=UNBOUNDED_OUTPUT,
            limits=RunLimits(max_iterations=20, max_tokens=10**9),
        ),
        task_id="t-1",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="Read the pages. " * 100)])
    assert result.output == "The pages are all lorem ipsum."
    assert len(model.granted) == 9
    assert all(granted == expected for granted, expected in model.granted), model.granted
    last = scripted.requests[-1].messages
    assert any("removed to save context" in message.content for message in last)
    assert any("removed to fit the model's context window" in message.content for message in last)
