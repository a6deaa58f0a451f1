"""A limit carries the outcome it produces and the fallback text that names it."""

from __future__ import annotations

import pytest

from worker.loop import Limit, LoopState, ResponseEntry, RunLimits
from worker.loop._limits import FALLBACK_ANSWER, LimitReached
from worker.models import ModelResponse, Usage
from worker.task import Outcome


def progress(iterations: int, spent: Usage) -> LoopState:
    """A run that has made ``iterations`` steps and spent ``spent`` on them."""
    state = LoopState(messages=[])
    for step in range(1, iterations + 1):
        state.apply(ResponseEntry(step=step, response=ModelResponse(text="", usage=Usage())))
    state.usage = spent
    return state


def test_every_limit_ends_the_run_with_its_own_outcome_which_answers() -> None:
    assert {limit: limit.outcome for limit in Limit} == {
        Limit.MAX_ITERATIONS: Outcome.MAX_ITERATIONS,
        Limit.MAX_TOKENS: Outcome.MAX_TOKENS,
        Limit.DEADLINE: Outcome.DEADLINE,
        Limit.BUDGET: Outcome.BUDGET,
    }
    assert all(limit.outcome.answers for limit in Limit)


def test_a_limit_is_found_from_its_outcome_and_names_itself_in_the_fallback() -> None:
    assert Limit.of(Outcome.BUDGET) is Limit.BUDGET
    assert Limit.of(Outcome.COMPLETED) is None and Limit.of(Outcome.TOOL_LOOP) is None
    assert Limit.DEADLINE.fallback_answer == FALLBACK_ANSWER.format(limit="deadline")
    assert "within its max_tokens limit" in Limit.MAX_TOKENS.fallback_answer


@pytest.mark.parametrize(
    ("limits", "iterations", "remaining_s", "spent", "expected"),
    [
        (RunLimits(max_iterations=2), 2, 100.0, Usage(), Limit.MAX_ITERATIONS),
        (RunLimits(max_duration_s=100), 0, 1.0, Usage(), Limit.DEADLINE),
        (RunLimits(max_tokens=10), 0, 100.0, Usage(input_tokens=11), Limit.MAX_TOKENS),
        (RunLimits(max_cost_usd=0.1), 0, 100.0, Usage(cost_usd=0.2), Limit.BUDGET),
    ],
)
def test_check_step_raises_with_the_limit_reached(
    limits: RunLimits, iterations: int, remaining_s: float, spent: Usage, expected: Limit
) -> None:
    with pytest.raises(LimitReached) as raised:
        limits.check_step(progress(iterations, spent), remaining_s=remaining_s)
    assert raised.value.limit is expected
    assert raised.value.message.startswith(
        ("max_iterations", "max_duration_s", "max_tokens", "max_cost")
    )


def test_check_step_passes_inside_every_limit() -> None:
    RunLimits(max_cost_usd=1.0).check_step(progress(0, Usage()), remaining_s=100.0)
