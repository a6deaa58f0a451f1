"""What budgeting a model call costs before it is made, per step, as the conversation grows.

Before every model call the loop counts the request's characters (system prompt,
messages, tool calls, the offered tools' schemas), estimates its input tokens and
plans the call's output against the token and cost limits. This measures exactly
those steps (``InputEstimator`` and ``plan_call``, as ``AgentLoop._plan`` runs them)
on conversations of a realistic shape: each step one tool call and a ~420-character
tool result, ten offered tools. The target is well under 1 ms per step.
"""

from __future__ import annotations

import time

from bench._report import Summary, Table
from bench._size import Size
from worker.loop import RunLimits
from worker.loop._budget import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    MIN_STEP_OUTPUT_TOKENS,
    InputEstimator,
    plan_call,
)
from worker.models import Message, ModelPrice, ToolCall, ToolSpec, Usage

STEP_COUNTS = (5, 20, 80, 320)
REPEATS = 2000
QUICK_REPEATS = 100
SYSTEM = "You are an agent of the Hub. Be brief, cite your sources. " * 40
TOOL_OUTPUT = "search result: " + "lorem ipsum dolor sit amet " * 15
PRICE = ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0, cache_write_per_mtok=3.75)
TOOLS = [
    ToolSpec(
        name=f"hub__tool_{number}",
        description="Search the Hub's posts by keyword, community or author.",
        input_schema={
            "type": "object",
            "properties": {"query": {"type": "string"}, "page": {"type": "integer"}},
            "required": ["query"],
        },
    )
    for number in range(10)
]


def conversation(steps: int) -> list[Message]:
    messages = [Message(role="user", content="Please look into this thread. " * 30)]
    for step in range(steps):
        call = ToolCall(id=f"call-{step}", name="hub__tool_1", arguments='{"query": "x"}')
        messages.append(Message(role="assistant", content="", tool_calls=(call,)))
        messages.append(Message(role="tool", content=TOOL_OUTPUT, tool_call_id=call.id))
    return messages


def plan_once(estimator: InputEstimator, messages: list[Message]) -> int:
    """One step's pre-call budgeting, as the loop does it."""
    chars = estimator.request_chars(SYSTEM, messages, TOOLS)
    plan = plan_call(
        RunLimits(max_tokens=10_000_000, max_cost_usd=1000.0),
        Usage(input_tokens=5000, output_tokens=500, cost_usd=0.02),
        input_tokens=estimator.estimate(chars, len(messages)),
        input_chars=chars,
        wanted_output_tokens=DEFAULT_MAX_OUTPUT_TOKENS,
        minimum_output_tokens=MIN_STEP_OUTPUT_TOKENS,
        price=PRICE,
    )
    return plan.max_output_tokens


def per_call_us(steps: int, repeats: int) -> Summary:
    """Microseconds per budgeted call, five batches of ``repeats`` calls."""
    messages = conversation(steps)
    estimator = InputEstimator()
    plan_once(estimator, messages)  # the offered tools' size is computed once per tool list
    batches = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            plan_once(estimator, messages)
        batches.append((time.perf_counter() - started) / repeats * 1e6)
    return Summary.of(batches)


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    repeats = size.pick(full=REPEATS, quick=QUICK_REPEATS, smoke=1)
    table = Table(
        "pre-call budgeting (tokens + cost) per model call",
        ["steps so far", "messages", "median us", "min-max us"],
    )
    for steps in STEP_COUNTS:
        summary = per_call_us(steps, repeats)
        table.add(steps, 1 + 2 * steps, *summary.cells(1))
    table.notes.append(
        f"{repeats} calls per batch, 5 batches; the target is under 1000 us (1 ms) per step"
    )
    return [table]
