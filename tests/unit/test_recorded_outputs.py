"""The loop on recorded outputs of a real small model, through the real openai SDK.

``qwen2.5-coder-1.5b-get-time.jsonl``: llama-server (llama.cpp 11434.0.0) serving
Qwen2.5-Coder-1.5B-Instruct Q4_K_M with the fenced chat template ``make eval`` writes,
asked the time with one ``get_time`` tool. That model answers every request that offers
tools with the same call, also after the tool's result; replaying the recorded answer
for each request is what it does.
"""

from __future__ import annotations

import pytest

from tests.support.recorded_llm import RecordedEndpoint, exchanges
from worker.loop import AgentLoop, Closing, LoopSettings, ToolCallRecord
from worker.models import Message
from worker.task import Outcome
from worker.tools import LocalTool, LocalToolbox

pytestmark = pytest.mark.anyio

GET_TIME = exchanges("qwen2.5-coder-1.5b-get-time.jsonl")


class TimeIsARead:
    def read_only(self, tool: str) -> bool:
        return tool == "get_time"

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        return None


async def test_a_model_that_repeats_its_call_gets_notes_then_a_closing_turn() -> None:
    endpoint = RecordedEndpoint(GET_TIME * 5)
    times: list[str] = []

    def get_time() -> str:
        times.append("12:00")
        return "2026-11-24T12:00:00Z"

    loop = AgentLoop(
        model=endpoint.model(),
        toolbox=LocalToolbox([LocalTool(name="get_time", function=get_time)]),
        system="",
        settings=LoopSettings(call_rules=TimeIsARead(), max_same_call_repeats=3),
        task_id="t-1",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="What time is it? Use the tool.")])
    assert times == ["12:00"]  # run once; the repeats got the earlier result
    assert [step.requested_calls[0].name for step in result.steps[:4]] == ["get_time"] * 4
    notes = [m["content"] for m in endpoint.requests[2]["messages"] if m["role"] == "user"]
    assert "is the same as in step 1, so it was not run again" in notes[-1]
    closing = endpoint.requests[-1]
    assert "tools" not in closing and "Do not call any tool" in closing["messages"][-1]["content"]
    # The recorded answer to the closing turn is the call again: no answer, so tool_loop.
    assert result.outcome is Outcome.TOOL_LOOP and result.output == ""
    assert result.state.usage.input_tokens == 5 * 167
