"""Tokens and cost are budgeted before each model call; a call that overspends ends the run."""

from __future__ import annotations

import math
from typing import Any

import pytest

from worker.loop import AgentLoop, LoopSettings, RunLimits, RunResult
from worker.loop._budget import (
    MIN_CLOSING_OUTPUT_TOKENS,
    InputEstimator,
    dearest_price,
    plan_call,
)
from worker.loop._limits import FALLBACK_ANSWER
from worker.models import Message, ModelRequest, Usage
from worker.models._prices import ModelPrice, PriceTable
from worker.models._scripted import ScriptedModel, Turn
from worker.task import Outcome
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
# $1 per million input tokens, $4 per million output tokens.
PRICE = ModelPrice(input_per_mtok=1.0, output_per_mtok=4.0)


def toolbox() -> LocalToolbox:
    return LocalToolbox(
        [LocalTool(name="lookup", function=lambda n: f"result {n} " * 20, input_schema=SCHEMA)]
    )


def honest_input_tokens(request: ModelRequest) -> int:
    """What a provider tokenising at 4 characters a token would report as input."""
    estimator = InputEstimator(chars_per_token=4.0, safety_margin=0.0)
    chars = estimator.request_chars(request.system, request.messages, request.tools)
    return math.ceil(chars / 4)


def greedy_turn(step: int, *, price: ModelPrice | None = None, output: int | None = None) -> Any:
    """A provider answering ``output`` tokens (all it is allowed, if None), with a tool call."""

    def answer(request: ModelRequest) -> Turn:
        assert request.max_output_tokens is not None
        tokens_in = honest_input_tokens(request)
        tokens_out = min(request.max_output_tokens, output or request.max_output_tokens)
        cost = price.cost(tokens_in, tokens_out) if price else 0.0
        calls: list[tuple[str, dict[str, Any] | str]] = (
            [("lookup", {"n": step})] if request.tools else []
        )
        return Turn(
            text="closing answer" if not request.tools else "",
            tool_calls=calls,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cost_usd=cost,
        )

    return answer


async def run(turns: list[Any], settings: LoopSettings) -> tuple[RunResult, ScriptedModel]:
    model = ScriptedModel(turns)
    loop = AgentLoop(
        model=model,
        toolbox=toolbox(),
        system="You are a test agent. " * 10,
        settings=settings,
        task_id="t-budget",
        agent_id="test-agent",
    )
    result = await loop.run([Message(role="user", content="find things " * 20)])
    return result, model


# --- tokens --------------------------------------------------------------------------------


async def test_steady_usage_never_carries_the_tokens_past_their_limit() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=3000, max_iterations=50))
    result, model = await run([greedy_turn(i, output=150) for i in range(50)], settings)
    assert result.outcome is Outcome.MAX_TOKENS
    assert result.state.usage.total_tokens <= 3000
    assert len(model.requests) >= 3  # it did work before the limit stopped it


async def test_each_call_is_given_only_the_output_the_token_limit_leaves() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=1000), max_output_tokens=4000)
    result, model = await run([greedy_turn(i) for i in range(10)], settings)
    spent = 0
    for request, step in zip(model.requests, result.steps, strict=True):
        assert request.max_output_tokens is not None
        assert spent + honest_input_tokens(request) + request.max_output_tokens <= 1000
        spent += step.usage.total_tokens


async def test_a_call_that_cannot_fit_is_never_made() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=50))  # less than the prompt itself
    result, model = await run([greedy_turn(0)], settings)
    assert model.requests == []
    assert result.outcome is Outcome.MAX_TOKENS
    assert result.output == FALLBACK_ANSWER.format(limit="max_tokens") and result.fallback


async def test_a_50k_token_jump_ends_with_max_tokens_never_completed() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=1000))
    turns = [Turn(text="a final answer", input_tokens=20, output_tokens=50_000)]
    result, _ = await run(turns, settings)
    assert result.outcome is Outcome.MAX_TOKENS
    assert result.state.usage.total_tokens == 50_020
    assert "exceeded" in result.detail and "50020 of 1000" in result.detail
    assert result.output == "a final answer"


async def test_an_overspending_tool_step_runs_no_tool() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=1000))
    turns = [Turn(tool_calls=[("lookup", {"n": 1})], input_tokens=900, output_tokens=900)]
    result, _ = await run(turns, settings)
    assert result.outcome is Outcome.MAX_TOKENS
    assert result.state.tool_calls == 0
    assert result.fallback


async def test_the_closing_call_is_budgeted_too() -> None:
    settings = LoopSettings(limits=RunLimits(max_tokens=100_000, max_iterations=1))
    turns = [
        Turn(tool_calls=[("lookup", {"n": 1})], input_tokens=99_000, output_tokens=500),
        Turn(text="never asked"),
    ]
    result, model = await run(turns, settings)
    # 500 tokens left cannot hold the conversation again: no closing call, the fallback.
    assert len(model.requests) == 1
    assert result.outcome is Outcome.MAX_ITERATIONS and result.fallback


# --- cost ----------------------------------------------------------------------------------


async def test_steady_usage_never_carries_the_cost_past_its_budget() -> None:
    settings = LoopSettings(
        limits=RunLimits(max_cost_usd=0.01, max_iterations=50), price=PRICE, max_output_tokens=500
    )
    turns = [greedy_turn(i, price=PRICE, output=300) for i in range(50)]
    result, model = await run(turns, settings)
    assert result.outcome is Outcome.BUDGET
    assert result.state.usage.cost_usd is not None and result.state.usage.cost_usd <= 0.01
    assert len(model.requests) >= 2


async def test_remaining_cost_is_passed_as_max_output_tokens() -> None:
    settings = LoopSettings(limits=RunLimits(max_cost_usd=0.002), price=PRICE)
    result, model = await run([greedy_turn(i, price=PRICE) for i in range(10)], settings)
    spent = 0.0
    for request, step in zip(model.requests, result.steps, strict=True):
        assert request.max_output_tokens is not None
        worst = PRICE.cost(honest_input_tokens(request), request.max_output_tokens)
        assert spent + worst <= 0.002 + 1e-12
        spent += step.usage.cost_usd or 0.0


async def test_a_provider_overcharging_ends_with_budget() -> None:
    settings = LoopSettings(limits=RunLimits(max_cost_usd=0.10), price=PRICE)
    result, _ = await run([Turn(text="pricey", cost_usd=0.17)], settings)
    assert result.outcome is Outcome.BUDGET
    assert "max_cost_usd exceeded" in result.detail


async def test_a_fallback_chain_is_budgeted_at_its_dearest_member() -> None:
    cheap = ModelPrice(input_per_mtok=0.1, output_per_mtok=0.4)
    dear = ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0, cache_write_per_mtok=3.75)
    price = dearest_price([cheap, dear])
    assert price is not None
    assert (price.input_per_mtok, price.output_per_mtok) == (3.0, 15.0)
    assert price.cache_write_per_mtok == 3.75
    assert dearest_price([cheap, None]) is None  # one unknown price: the cost is unknown


# --- the planner and the estimate ----------------------------------------------------------


def test_the_planner_names_the_limit_and_the_values() -> None:
    limits = RunLimits(max_tokens=1000)
    with pytest.raises(Exception, match="max_tokens reached: 900 of 1000"):
        plan_call(
            limits,
            Usage(input_tokens=800, output_tokens=100),
            input_tokens=80,
            input_chars=280,
            wanted_output_tokens=4096,
            minimum_output_tokens=MIN_CLOSING_OUTPUT_TOKENS,
            price=None,
        )
    plan = plan_call(
        limits,
        Usage(input_tokens=500, output_tokens=100),
        input_tokens=80,
        input_chars=280,
        wanted_output_tokens=4096,
        minimum_output_tokens=MIN_CLOSING_OUTPUT_TOKENS,
        price=None,
    )
    assert plan.max_output_tokens == 1000 - 600 - 80


def test_the_estimate_calibrates_on_reported_usage() -> None:
    estimator = InputEstimator()
    before = estimator.estimate(3500, messages=1)
    estimator.observe(3500, 2000)  # dense text: 0.57 tokens a character, not 0.29
    after = estimator.estimate(3500, messages=1)
    assert before < 2000 <= after
    estimator.observe(3500, 10)  # a lower report never lowers the estimate
    assert estimator.estimate(3500, messages=1) == after


def test_the_budgeting_benchmark_plans_real_calls() -> None:
    from bench.budgeting import conversation, plan_once

    # Functional only (nothing timed): a long conversation still leaves a full answer.
    assert plan_once(InputEstimator(), conversation(80)) == 4096


def test_a_budget_plans_with_an_hours_cache_write_when_a_model_may_write_one() -> None:
    # Sonnet 4.5 writes an hour's cache at $6 per million input tokens: the dearest input rate.
    price = dearest_price([PriceTable.builtin().price("claude-sonnet-4-5")])
    assert price is not None and price.write_1h_price == 6.0
    limits = RunLimits(max_cost_usd=0.0061 + 100 * 15.0 / 1_000_000)
    plan = plan_call(
        limits,
        Usage(),
        input_tokens=1000,
        input_chars=4000,
        wanted_output_tokens=4096,
        minimum_output_tokens=16,
        price=price,
    )
    assert plan.max_output_tokens == 106
