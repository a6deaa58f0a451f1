"""The loop on recorded outputs of a real small model, through the real openai SDK.

``qwen2.5-coder-1.5b-get-time.jsonl``: llama-server (llama.cpp 11434.0.0) serving
Qwen2.5-Coder-1.5B-Instruct Q4_K_M with the fenced chat template ``make eval`` writes,
asked the time with one ``get_time`` tool. That model answers every request that offers
tools with the same call, also after the tool's result; replaying the recorded answer
for each request is what it does.
"""

from __future__ import annotations

import itertools

import pytest

from tests.support.provider_wire import FakeProvider
from tests.support.recorded_llm import exchanges, local_model, replaying
from worker.loop import AgentLoop, Closing, LoopSettings, RunLimits, RunResult, ToolCallRecord
from worker.models import Message
from worker.task import Outcome
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

GET_TIME = exchanges("qwen2.5-coder-1.5b-get-time.jsonl")


class TimeIsARead:
    def read_only(self, tool: str) -> bool:
        return tool == "get_time"

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        return None


async def test_a_model_that_repeats_its_call_gets_notes_then_a_closing_turn() -> None:
    endpoint = replaying(GET_TIME * 6)
    times: list[str] = []

    def get_time() -> str:
        times.append("12:00")
        return "2026-11-24T12:00:00Z"

    loop = AgentLoop(
        model=local_model(endpoint),
        toolbox=LocalToolbox([LocalTool(name="get_time", function=get_time)]),
        system="",
        settings=LoopSettings(call_rules=TimeIsARead(), max_same_call_repeats=3),
        task_id="t-1",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="What time is it? Use the tool.")])
    assert times == ["12:00"]  # run once; the repeats got the earlier result
    assert [step.requested_calls[0].name for step in result.steps[:4]] == ["get_time"] * 4
    notes = [m["content"] for m in endpoint.body(2)["messages"] if m["role"] == "user"]
    assert "is the same as in step 1, so it was not run again" in notes[-1]
    closing, retold = endpoint.body(-2), endpoint.body(-1)
    assert closing["tool_choice"] == "none" and "tools" not in retold
    assert "Do not call any tool" in closing["messages"][-1]["content"]
    # The model wrote nothing but calls: each is told on the user's side, with its result.
    [told] = retold["messages"]
    assert told["role"] == "user" and told["content"].count("You called get_time with {}.") == 4
    # The recorded answer to the closing turn, and to it retold, is the call again: no
    # answer, so tool_loop.
    assert result.outcome is Outcome.TOOL_LOOP and result.output == ""
    assert result.state.usage.input_tokens == 6 * 167


# ``qwen2.5-coder-1.5b-redis-port.jsonl``: the same server, ``make eval``'s question in a
# thread ("what is the default TCP port of a Redis server?") with the Hub's tools. The model
# searches, reads the thread, posts its answer as a new post, reads that post three times and,
# at max_iterations, answers the closing turn (no tool callable) with one more call in a
# ```json fence.
# The last exchange is its answer to the same closing turn retold in plain text (recorded
# when the retelling still told the calls in the model's own turns). Each request is kept as
# its gist only: the tools offered and the last message.
REDIS_PORT = exchanges("qwen2.5-coder-1.5b-redis-port.jsonl")
THREAD = (
    "[p-1] m/general · by alice at 2026-11-25 20:18 UTC\n"
    "@eval-agent what is the default TCP port of a Redis server?\n\nNo comments yet."
)
OWN_POST = (
    "[p-13] m/general · by eval-agent at 2026-11-25 20:21 UTC\nTitle: Redis Port\n"
    "The default TCP port of a Redis server is 6379.\n\nNo comments yet."
)


class HubReads:
    def read_only(self, tool: str) -> bool:
        return tool in {"hub__search_posts", "hub__get_thread"}

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        return None


def hub_tools(posted: list[str]) -> LocalToolbox:
    def search_posts(query: str, **_: object) -> str:
        return f"No posts match '{query}'."

    def get_thread(post_id: str) -> str:
        return THREAD if post_id == "p-1" else OWN_POST

    def create_post(content: str, **_: object) -> str:
        posted.append(content)
        return "Created post p-13 in m/general."

    return LocalToolbox(
        [
            LocalTool(name="hub__search_posts", function=search_posts),
            LocalTool(name="hub__get_thread", function=get_thread),
            LocalTool(name="hub__create_post", function=create_post),
        ]
    )


async def ask_the_redis_port(endpoint: FakeProvider, posted: list[str]) -> RunResult:
    """``make eval``'s question in a thread, to the eval agent's loop on recorded answers."""
    loop = AgentLoop(
        model=local_model(endpoint),
        toolbox=hub_tools(posted),
        system="You are eval-agent.",
        settings=LoopSettings(call_rules=HubReads(), limits=RunLimits(max_iterations=6)),
        task_id="t-1",
        agent_id="eval-agent",
    )
    question = "What is the default TCP port of a Redis server?"
    return await loop.run([Message(role="user", content=question)])


async def test_a_closing_turn_answered_with_a_call_is_retold_in_plain_text() -> None:
    endpoint = replaying(REDIS_PORT)
    posted: list[str] = []
    result = await ask_the_redis_port(endpoint, posted)
    assert posted == ["The default TCP port of a Redis server is 6379."]
    first_closing, retold = endpoint.body(-2), endpoint.body(-1)
    assert first_closing["tool_choice"] == "none"
    assert any(m.get("tool_calls") for m in first_closing["messages"])
    # Retold: no tool calls nor tool messages, roles alternating, the closing prompt last.
    assert "tools" not in retold
    roles = [message["role"] for message in retold["messages"]]
    assert "tool" not in roles and all("tool_calls" not in m for m in retold["messages"])
    assert all(a != b for a, b in itertools.pairwise(roles))
    told = retold["messages"][-1]["content"]
    assert "Do not call any tool" in told
    assert 'You called hub__get_thread with {"post_id": "p-13"}. Result:' in told
    assistant = [m["content"] for m in retold["messages"] if m["role"] == "assistant"]
    assert not any("called" in text for text in assistant)  # nothing of the calls to copy
    # The recorded answer to the retold turn is the answer: posted as the reply, at the limit.
    assert result.outcome is Outcome.MAX_ITERATIONS
    assert "6379" in result.output
    assert len(result.state.steps) == 8 and result.state.steps[-1].final


# ``qwen2.5-coder-1.5b-redis-port-retold.jsonl``: the same question in ``make eval`` on
# 2026-11-26, with the retelling that tells each call on the user's side. The model searches,
# reads the thread five times until the repeat guard stops it, answers the tool-less closing
# turn with a fenced call, and answers the retelling.
REDIS_PORT_RETOLD = exchanges("qwen2.5-coder-1.5b-redis-port-retold.jsonl")


async def test_a_retelling_on_the_users_side_gets_the_small_models_answer() -> None:
    endpoint = replaying(REDIS_PORT_RETOLD)
    posted: list[str] = []
    result = await ask_the_redis_port(endpoint, posted)
    retold = endpoint.body(-1)["messages"]
    assert [message["role"] for message in retold] == ["system", "user"]
    assert 'You called hub__get_thread with {"post_id": "p-1"}. Result:' in retold[-1]["content"]
    # The loop guard closed the run and the retold closing turn brought the answer.
    assert result.outcome is Outcome.COMPLETED and posted == []
    assert result.output == "The default TCP port of a Redis server is 6379."


# ``qwen2.5-coder-1.5b-long-thread.jsonl``: ``make eval``'s thread of 200 comments, the
# server at a 4096-token context. The worker cut the thread to fit by its estimate (3.5
# characters a token), but its ids, timestamps and tags took 2.1: llama-server refused the
# 4617-token request (the first exchange, kept with the system prompt and the tools that
# were offered). The second is that server's answer to the request cut again, which this
# test sends.
LONG_THREAD = exchanges("qwen2.5-coder-1.5b-long-thread.jsonl")


async def test_a_prompt_the_server_finds_too_long_is_cut_again_by_its_count() -> None:
    refused = LONG_THREAD[0]["request"]
    endpoint = replaying(LONG_THREAD)
    tools = [
        LocalTool(
            name=tool["function"]["name"],
            function=lambda **_: "",
            description=tool["function"]["description"],
            input_schema=tool["function"]["parameters"],
        )
        for tool in refused["tools"]
    ]
    loop = AgentLoop(
        model=local_model(endpoint),
        toolbox=LocalToolbox(tools),
        system=refused["system"],
        settings=LoopSettings(
            limits=RunLimits(max_iterations=1),
            context_window_tokens=4096,
            max_output_tokens=512,
            temperature=0.0,
        ),
        task_id="t-1",
        agent_id="eval-agent",
    )
    thread = refused["last_message"]["content"]
    result = await loop.run([Message(role="user", content=thread)])
    first, second = (endpoint.body(i)["messages"][-1]["content"] for i in (0, 1))
    assert first == thread
    assert "characters of older content left out" in second and len(second) < len(thread)
    assert second.endswith(thread[-600:])  # the newest comments, with the question, stay
    answer = LONG_THREAD[1]["response"]
    assert answer["usage"]["prompt_tokens"] <= 4096 - 512
    # One iteration: the search it asked for ran, and the closing turn answered.
    assert result.outcome is Outcome.MAX_ITERATIONS and "thursday" in result.output.lower()
