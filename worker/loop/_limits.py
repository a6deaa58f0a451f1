"""Limits of one run, as data. Each ``check_*`` raises LimitReached naming limit and value.

Adding a limit: a ``Limit`` member naming the Outcome it ends the run with (an Outcome
of the same name, in ``worker.task``), and a ``RunLimits`` field checked in
``check_step`` (or after a call, in ``check_spent``). The loop, the CLI executors'
reports and the fallback text follow from those; a task constraint for it is wire
format (``worker.task.Constraints``, the agent's ``limits``), passed to ``tightened``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from worker.exceptions import Severity, WorkerError
from worker.loop._state import LoopState
from worker.models import Usage
from worker.task import Outcome

N = TypeVar("N", int, float)

FALLBACK_ANSWER = (
    "I could not finish this task within its {limit} limit, so I am stopping here without a "
    "complete answer."
)


class Limit(StrEnum):
    """A limit of the run, by the name messages use, and the outcome reaching it produces."""

    outcome: Outcome

    def __new__(cls, value: str, outcome: Outcome) -> Limit:
        member = str.__new__(cls, value)
        member._value_ = value
        member.outcome = outcome
        return member

    MAX_ITERATIONS = "max_iterations", Outcome.MAX_ITERATIONS
    MAX_TOKENS = "max_tokens", Outcome.MAX_TOKENS
    DEADLINE = "deadline", Outcome.DEADLINE
    BUDGET = "budget", Outcome.BUDGET

    @property
    def fallback_answer(self) -> str:
        """What the run answers when the model wrote nothing usable before the limit."""
        return FALLBACK_ANSWER.format(limit=self.value)

    @classmethod
    def of(cls, outcome: Outcome) -> Limit | None:
        """The limit that produces ``outcome``; None for an outcome no limit produces."""
        return next((limit for limit in cls if limit.outcome is outcome), None)


class LimitReached(WorkerError):
    """A limit of the run was reached; ``limit`` says which, and so the outcome it produces."""

    code = "limit_reached"
    severity = Severity.INFO

    def __init__(self, message: str, *, limit: Limit) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(slots=True, kw_only=True, frozen=True)
class RunLimits:
    max_iterations: int = 10
    max_tokens: int = 100_000
    max_duration_s: float = 300.0
    max_cost_usd: float | None = None
    # Time kept back from the deadline for the closing, tool-less answer.
    final_answer_reserve_s: float = 10.0

    def check_step(self, state: LoopState, *, remaining_s: float) -> None:
        """Before a step: LimitReached for the first limit the run has reached."""
        self.check_iterations(state.iterations)
        self.check_deadline(remaining_s)
        self.check_spent(state.usage)  # a resumed run may already be past one

    def check_iterations(self, iterations: int) -> None:
        if iterations >= self.max_iterations:
            raise LimitReached(
                f"max_iterations reached: {iterations} of {self.max_iterations} iterations used",
                limit=Limit.MAX_ITERATIONS,
            )

    def check_tokens(self, total_tokens: int, next_call_tokens: int = 0) -> None:
        """Reached when the next call, at most ``next_call_tokens``, would cross the limit."""
        if total_tokens + next_call_tokens > self.max_tokens or total_tokens >= self.max_tokens:
            raise LimitReached(
                f"max_tokens reached: {total_tokens} of {self.max_tokens} tokens used, "
                f"the next call needs at least {next_call_tokens}",
                limit=Limit.MAX_TOKENS,
            )

    def check_cost(self, cost_usd: float | None, next_call_cost_usd: float = 0.0) -> None:
        """Reached when the next call, at least ``next_call_cost_usd``, would cross the budget."""
        if self.max_cost_usd is None or cost_usd is None:
            return  # an unknown price cannot be held against a budget
        if cost_usd + next_call_cost_usd > self.max_cost_usd or cost_usd >= self.max_cost_usd:
            raise LimitReached(
                f"max_cost_usd reached: ${cost_usd:.4f} of ${self.max_cost_usd:.4f} spent, "
                f"the next call costs at least ${next_call_cost_usd:.4f}",
                limit=Limit.BUDGET,
            )

    def check_spent(self, usage: Usage) -> None:
        """After a call: reached when what was spent already passed a limit.

        Pre-call budgeting keeps steady calls inside the limits; only a provider that
        ignores ``max_output_tokens`` or misreports usage gets here.
        """
        if usage.total_tokens > self.max_tokens:
            raise LimitReached(
                f"max_tokens exceeded: {usage.total_tokens} of {self.max_tokens} tokens used "
                "(the provider answered past the call's budget)",
                limit=Limit.MAX_TOKENS,
            )
        cost = usage.cost_usd
        if self.max_cost_usd is not None and cost is not None and cost > self.max_cost_usd:
            raise LimitReached(
                f"max_cost_usd exceeded: ${cost:.4f} of ${self.max_cost_usd:.4f} spent "
                "(the provider answered past the call's budget)",
                limit=Limit.BUDGET,
            )

    def check_deadline(self, remaining_s: float) -> None:
        if remaining_s <= self.reserve_s:
            # Re-runs share the first run's deadline: what is left is what counts.
            raise LimitReached(
                f"max_duration_s reached: {max(remaining_s, 0.0):.1f} s left before the "
                f"task's deadline (max_duration_s {self.max_duration_s:g} s)",
                limit=Limit.DEADLINE,
            )

    @property
    def reserve_s(self) -> float:
        # Never reserve more than a tenth of a short budget.
        return min(self.final_answer_reserve_s, self.max_duration_s / 10)

    def tightened(
        self,
        *,
        max_iterations: int | None = None,
        max_tokens: int | None = None,
        max_duration_s: float | None = None,
        max_cost_usd: float | None = None,
    ) -> RunLimits:
        """These limits narrowed by a task's constraints; a constraint can only tighten."""
        return RunLimits(
            max_iterations=_tighter(self.max_iterations, max_iterations),
            max_tokens=_tighter(self.max_tokens, max_tokens),
            max_duration_s=_tighter(self.max_duration_s, max_duration_s),
            max_cost_usd=(
                max_cost_usd
                if self.max_cost_usd is None
                else _tighter(self.max_cost_usd, max_cost_usd)
            ),
            final_answer_reserve_s=self.final_answer_reserve_s,
        )


def _tighter(current: N, requested: N | None) -> N:
    return current if requested is None else min(current, requested)
