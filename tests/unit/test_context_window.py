"""A bounded context window: the thread and the tool history are cut, oldest first.

The loop cuts before each call so the request fits ``context_window_tokens`` with room
for an answer; the notification prompt keeps the newest comments of a long thread.
The real server at a 4096-token context is the opt-in test_real_model.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from hub_client import Author, Comment, Post
from tests.support.pipeline import DEMO_AGENTS
from worker.agents import AgentDefinition, AgentStore
from worker.loop import AgentLoop, LoopSettings
from worker.loop._budget import InputEstimator
from worker.models import Message, ModelRequest, UntrustedBlocks
from worker.models._scripted import ScriptedModel, Turn
from worker.pipeline._prompt import first_message
from worker.task import Task
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

WINDOW = 4096


def estimated_tokens(request: ModelRequest) -> int:
    """The loop's own (safe-side) estimate of a request, before any calibration."""
    estimator = InputEstimator()
    chars = estimator.request_chars(request.system, request.messages, request.tools)
    return estimator.estimate(chars, len(request.messages))


async def test_a_long_tool_history_is_cut_to_fit_the_window() -> None:
    def page(n: int) -> str:
        return f"page {n}: " + "lorem ipsum dolor sit amet " * 300  # ~8,000 characters

    box = LocalToolbox([LocalTool(name="page", function=page)])
    turns = [Turn(tool_calls=[("page", {"n": n})]) for n in range(4)] + [
        Turn(text="The pages are all lorem ipsum.")
    ]
    model = ScriptedModel(turns)
    loop = AgentLoop(
        model=model,
        toolbox=box,
        system="You are a test agent.",
        settings=LoopSettings(context_window_tokens=WINDOW, max_output_tokens=512),
        task_id="t-1",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="Read the pages.")])
    assert result.output == "The pages are all lorem ipsum."
    for request in model.requests:
        assert estimated_tokens(request) + (request.max_output_tokens or 0) <= WINDOW
    last = model.requests[-1].messages
    stubbed = [m.content for m in last if m.content.startswith("[tool output of")]
    assert stubbed and all("to fit the model's context window" in text for text in stubbed)
    assert last[-1].content.startswith("page 3:")  # the newest result is kept whole


async def test_one_message_longer_than_the_window_loses_its_oldest_part() -> None:
    head = "Instructions: answer the last question.\n"
    body = "".join(f"comment {n}: nothing to add here, really.\n" for n in range(1000))
    model = ScriptedModel([Turn(text="Thursday.")])
    loop = AgentLoop(
        model=model,
        toolbox=LocalToolbox([]),
        system="You are a test agent.",
        settings=LoopSettings(context_window_tokens=WINDOW, max_output_tokens=512),
        task_id="t-1",
        agent_id="test-agent",
    )
    await loop.run([Message(role="user", content=head + body + "Which day? Thursday.")])
    [request] = model.requests
    content = request.messages[0].content
    assert estimated_tokens(request) + (request.max_output_tokens or 0) <= WINDOW
    assert content.startswith(head) and content.endswith("Which day? Thursday.")
    assert "characters of older content left out to fit the model's context window" in content
    # The head (instructions, the oldest lines) and the newest lines stay; the middle goes.
    assert "comment 0:" in content and "comment 300:" not in content and "comment 999:" in content


def long_thread(comments: int) -> Post:
    when = datetime(2026, 11, 24, tzinfo=UTC)
    return Post(
        id="p-1",
        author=Author(id="gina"),
        content="Release planning for 4.3: let's pick a day.",
        created_at=when,
        comments=[
            Comment(id=f"c-{n}", author=Author(id="hank"), content=f"Note {n}.", created_at=when)
            for n in range(comments - 1)
        ]
        + [Comment(id="c-last", author=Author(id="gina"), content="@demo-agent which day?")],
    )


def agent_with_window(window: int | None) -> AgentDefinition:
    agent = AgentStore(str(DEMO_AGENTS)).load("demo-agent")
    brain = agent.config.brain.model_copy(update={"max_context_tokens": window})
    config = agent.config.model_copy(update={"brain": brain})
    return dataclasses.replace(agent, config=config)


def test_a_200_comment_thread_keeps_its_post_and_newest_comments_within_the_window() -> None:
    task = Task(task_id="t-1", type="notification", agent_id="demo-agent", post_id="p-1")
    agent = agent_with_window(WINDOW)
    message = first_message(task, agent, thread=long_thread(200), feed=[], blocks=UntrustedBlocks())
    assert len(message.content) < WINDOW * 2  # about half the window, in characters
    assert "Release planning for 4.3" in message.content and "which day?" in message.content
    assert "older comment(s) left out to fit the model's context window" in message.content
    assert "Note 0." not in message.content and "Note 197." in message.content
    unbounded = first_message(
        task, agent_with_window(None), thread=long_thread(200), feed=[], blocks=UntrustedBlocks()
    )
    assert "Note 0." in unbounded.content and "left out" not in unbounded.content
