"""The CPU of one Anthropic model call in the worker: the SDK's ``messages.create`` against
the SDK's ``post`` with the body already encoded, as ``AnthropicModel`` sends it.

Both build the same body (``AnthropicModel._body``: 12 tools, the agent's prompt, a
conversation of 1 or 10 steps, cache marks) and read the same answer through an in-process
transport, so the difference is what ``messages.create`` adds: a copy of the body, container
by container, before it encodes it. Taken in turns, round after round, so a busy moment of
the machine spreads over both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2

from bench._report import Table
from bench._size import Size
from worker.models import Message, ModelRequest, PromptCache, ToolCall, ToolSpec
from worker.models._anthropic import AnthropicModel

CALLS = 200
ROUNDS = 15
QUICK_ROUNDS = 4
SMOKE_ROUNDS = 1
TIMEOUT_S = 30.0

_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [{"type": "text", "text": "Noted, thanks."}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 40, "output_tokens": 8, "cache_read_input_tokens": 3000},
}


def _tools() -> list[ToolSpec]:
    def schema(i: int) -> dict[str, Any]:
        properties = {
            f"field_{j}": {"type": "string", "description": f"What field {j} of tool {i} holds."}
            for j in range(5)
        }
        return {"type": "object", "properties": properties, "required": ["field_0"]}

    return [
        ToolSpec(
            name=f"hub__tool_{i}",
            description="Does one thing on the Hub. " * 8,
            input_schema=schema(i),
        )
        for i in range(12)
    ]


def _request(steps: int) -> ModelRequest:
    messages = [Message(role="user", content="A thread of the Hub. " * 150)]
    for step in range(1, steps):
        call = ToolCall(id=f"toolu_{step}", name="hub__tool_1", arguments='{"field_0": "x"}')
        messages.append(Message(role="assistant", content="Looking.", tool_calls=(call,)))
        messages.append(Message(role="tool", content="A tool result. " * 60, tool_call_id=call.id))
    return ModelRequest(
        system="You are a reviewer on the Hub. " * 200,
        system_context="The untrusted-content notice and the budget line.",
        messages=messages,
        tools=_tools(),
    )


def _model() -> AnthropicModel:
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, json=_ANSWER))
    return AnthropicModel(
        "claude-sonnet-4-5",
        api_key="bench-key",
        http_client=httpx2.AsyncClient(transport=transport),
        prompt_cache=PromptCache(),
    )


async def _per_call_us(call: Callable[[], Awaitable[object]]) -> float:
    started = time.process_time()
    for _ in range(CALLS):
        await call()
    return (time.process_time() - started) / CALLS * 1e6


async def _measure(rounds: int, steps: int) -> tuple[list[float], list[float]]:
    model, request = _model(), _request(steps)
    client = model._client

    async def through_create() -> object:
        answer = await client.messages.create(**model._body(request), timeout=TIMEOUT_S)
        return model._response(answer)

    async def as_the_worker_sends_it() -> object:
        return await model._request_once(request, TIMEOUT_S)

    create, ours = [], []
    for _ in range(rounds + 1):  # the first round warms both up and is dropped
        create.append(await _per_call_us(through_create))
        ours.append(await _per_call_us(as_the_worker_sends_it))
    return create[1:], ours[1:]


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    rounds = size.pick(full=ROUNDS, quick=QUICK_ROUNDS, smoke=SMOKE_ROUNDS)
    table = Table(
        f"anthropic model call: CPU µs per call ({CALLS} calls a round, median of {rounds})",
        ["conversation", "messages.create", "the worker's post", "saved"],
        notes=[
            "in-process transport: no network, the SDK's request building and answer parsing",
            "both send the same method, URL, headers and body "
            "(tests/unit/test_provider_anthropic.py)",
        ],
    )
    for steps in (1, 10):
        create, ours = anyio.run(_measure, rounds, steps)
        sdk_us, our_us = statistics.median(create), statistics.median(ours)
        table.add(
            f"{steps} step(s)",
            f"{sdk_us:.0f}",
            f"{our_us:.0f}",
            f"{100 * (sdk_us - our_us) / sdk_us:.0f} %",
        )
    return [table]
