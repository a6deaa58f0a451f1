"""How much a benchmark runs: the figures to quote, a quicker look, or once to prove it runs."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")


class Size(StrEnum):
    """``python -m bench`` runs FULL; ``--quick`` QUICK; ``--smoke`` SMOKE, each benchmark
    once at its smallest (the test suite's check that every benchmark still starts)."""

    FULL = "full"
    QUICK = "quick"
    SMOKE = "smoke"

    def pick(self, *, full: T, quick: T, smoke: T) -> T:
        """The value of this size among the three."""
        return {Size.FULL: full, Size.QUICK: quick, Size.SMOKE: smoke}[self]
