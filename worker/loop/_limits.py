"""Limits of one run, as data. Each ``check_*`` raises LimitReached naming limit and value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from worker.exceptions import LimitReached
from worker.models import Usage

N = TypeVar("N", int, float)


@dataclass(slots=True, kw_only=True, frozen=True)
class RunLimits:
    max_iterations: int = 10
    max_tokens: int = 100_000
    max_duration_s: float = 300.0
    max_cost_usd: float | None = None
    # Time kept back from the deadline for the closing, tool-less answer.
    final_answer_reserve_s: float = 10.0

    def check_iterations(self, iterations: int) -> None:
        if iterations >= self.max_iterations:
            raise LimitReached(
                f"max_iterations reached: {iterations} of {self.max_iterations} iterations used",
                limit="max_iterations",
            )

    def check_tokens(self, total_tokens: int, next_call_tokens: int = 0) -> None:
        """Reached when the next call, at most ``next_call_tokens``, would cross the limit."""
        if total_tokens + next_call_tokens > self.max_tokens or total_tokens >= self.max_tokens:
            raise LimitReached(
                f"max_tokens reached: {total_tokens} of {self.max_tokens} tokens used, "
                f"the next call needs at least {next_call_tokens}",
                limit="max_tokens",
            )

    def check_cost(self, cost_usd: float | None, next_call_cost_usd: float = 0.0) -> None:
        """Reached when the next call, at least ``next_call_cost_usd``, would cross the budget."""
        if self.max_cost_usd is None or cost_usd is None:
            return  # an unknown price cannot be held against a budget
        if cost_usd + next_call_cost_usd > self.max_cost_usd or cost_usd >= self.max_cost_usd:
            raise LimitReached(
                f"max_cost_usd reached: ${cost_usd:.4f} of ${self.max_cost_usd:.4f} spent, "
                f"the next call costs at least ${next_call_cost_usd:.4f}",
                limit="budget",
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
                limit="max_tokens",
            )
        cost = usage.cost_usd
        if self.max_cost_usd is not None and cost is not None and cost > self.max_cost_usd:
            raise LimitReached(
                f"max_cost_usd exceeded: ${cost:.4f} of ${self.max_cost_usd:.4f} spent "
                "(the provider answered past the call's budget)",
                limit="budget",
            )

    def check_deadline(self, remaining_s: float) -> None:
        if remaining_s <= self.reserve_s:
            # Re-runs share the first run's deadline: what is left is what counts.
            raise LimitReached(
                f"max_duration_s reached: {max(remaining_s, 0.0):.1f} s left before the "
                f"task's deadline (max_duration_s {self.max_duration_s:g} s)",
                limit="deadline",
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
