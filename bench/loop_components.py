"""Where a loop step's CPU goes: each part of the loop made a no-op, against the loop as it is.

The run is ``loop_overhead``'s (20 steps, one tool call per step but the last, logs
off), taken in turns: the loop as it is, then once with each part below replaced by
a no-op, round after round, so a busy moment of the machine spreads over all of
them. A part's cost is the loop's median µs per step minus that of the loop without
it: a share of the floor measured in the same run, never an absolute target. Parts
overlap a little (a limit check inside the model-call plan), so the shares need
not add up. Production log lines (redacted, stderr to a pipe) are their own row.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from opentelemetry import trace

import worker.loop._dispatch as dispatch
import worker.loop._events as events
import worker.loop._limits as limits
import worker.loop._model_call as model_call
import worker.loop._run as run_module
import worker.tracing._genai as genai
from bench._report import Table
from bench._size import Size
from bench.loop_overhead import LogMode, log_targets, run

STEPS = 20
ROUNDS = 25
QUICK_ROUNDS = 6
SMOKE_ROUNDS = 1
_LIMIT_CHECKS = (
    "check_step",
    "check_iterations",
    "check_tokens",
    "check_cost",
    "check_spent",
    "check_deadline",
)


def _no_span(*args: Any, **kwargs: Any) -> Any:
    return contextlib.nullcontext(trace.INVALID_SPAN)


@contextmanager
def _replaced(*patches: tuple[Any, str, Any]) -> Iterator[None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _no_timeout(*args: Any, **kwargs: Any) -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


PARTS: dict[str, Callable[[], Any]] = {
    "tool-argument schema check": lambda: _replaced(
        (dispatch.ToolDispatcher, "_schema_problem", _none)
    ),
    "timeouts (a cancel scope around each call)": lambda: _replaced(
        *((module, "call_timeout", _no_timeout) for module in (dispatch, model_call, run_module))
    ),
    "tracing spans (none installed: no-op spans)": lambda: _replaced((genai, "span", _no_span)),
    "event bus (emit to the observers)": lambda: _replaced((events.EventBus, "emit", _none)),
    "limits (step, tokens, cost, deadline checks)": lambda: _replaced(
        *((limits.RunLimits, name, _none) for name in _LIMIT_CHECKS)
    ),
    "context-window fit before each call": lambda: _replaced(
        (run_module.AgentLoop, "_fit_window", _none)
    ),
}


async def _per_step_us() -> float:
    gc.collect()
    return (await run(STEPS)).overhead_per_step_us


async def _measure(rounds: int) -> tuple[list[float], dict[str, list[float]], list[float]]:
    floor: list[float] = []
    without: dict[str, list[float]] = {name: [] for name in PARTS}
    production: list[float] = []
    with log_targets() as targets:
        targets.use(LogMode.OFF)
        for _ in range(3):
            await run(STEPS)
        for _ in range(rounds):
            floor.append(await _per_step_us())
            for name, replaced in PARTS.items():
                with replaced():
                    without[name].append(await _per_step_us())
            targets.use(LogMode.PRODUCTION)
            production.append(await _per_step_us())
            targets.use(LogMode.OFF)
    return floor, without, production


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    rounds = size.pick(full=ROUNDS, quick=QUICK_ROUNDS, smoke=SMOKE_ROUNDS)
    floor, without, production = anyio.run(_measure, rounds)
    loop_us = statistics.median(floor)
    table = Table(
        f"loop components: CPU µs per step ({STEPS}-step runs, logs off) and share of the loop",
        ["part", "µs per step", "share of the loop"],
        notes=[
            "each part made a no-op, runs taken in turns with the loop as it is (same run)",
            "the production row adds log lines (redacted, stderr to a pipe) to the loop",
        ],
    )
    table.add("the loop as it is", f"{loop_us:.0f}", "100 %")
    for name, samples in without.items():
        cost = loop_us - statistics.median(samples)
        table.add(name, f"{cost:.0f}", f"{100 * cost / loop_us:.0f} %")
    logs_us = statistics.median(production) - loop_us
    table.add("log lines as in production", f"+{logs_us:.0f}", f"+{100 * logs_us / loop_us:.0f} %")
    return [table]
