"""What the agent loop itself costs per step and per tool call, model and tool time excluded.

One run: an in-process ScriptedModel asks for ``tool_calls_per_step`` calls of an
in-process LocalTool at every step but the last, which answers. Time spent inside
the model's ``complete`` and inside the tool function is measured and subtracted;
what is left is the loop: limits, dispatch (resolve, grant, JSON parse, schema
check), journal, compaction, events, metrics observer and log lines. Every run
builds a fresh AgentLoop, as every task does, so per-task set-up is included.

Log lines are measured three ways: logging off (level filter), stderr to
/dev/null, and as in production (the worker's redactor, stderr a pipe drained by
another process). Per tool call is the marginal cost: runs with three calls per
step against runs with one.
"""

from __future__ import annotations

import gc
import itertools
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

import anyio

from bench._report import Summary, Table
from bench._size import Size
from worker import logs
from worker.jobs import metrics_observer
from worker.loop import AgentLoop, LoopSettings, RunLimits
from worker.metrics import JobMetrics
from worker.models import Message, ModelRequest, ModelResponse
from worker.models._scripted import ScriptedModel, Turn
from worker.models._types import ModelWrapper
from worker.redaction import process_redactor
from worker.task import Outcome
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

STEP_COUNTS = (5, 20, 80)
# Runs per configuration (after warm-up): enough for a stable median at each length.
RUNS = {5: 60, 20: 30, 80: 12}
WARMUP_RUNS = 3
WIDE_STEP_CALLS = 3
LATE_STEPS = 4
TOOL_OUTPUT = "search result: " + "lorem ipsum dolor sit amet " * 15
TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What to look for."},
        "page": {"type": "integer", "minimum": 0},
    },
    "required": ["query", "page"],
}
# Values the production redactor must mask; they never appear in the bench's log lines.
_FAKE_SECRETS = ("bench-hub-key-0123456789", "bench-mcp-token-0123456789")


class LogMode(StrEnum):
    OFF = "logs off"
    DEVNULL = "stderr>/dev/null"
    PRODUCTION = "redacted, stderr>pipe"


@dataclass(slots=True, frozen=True)
class LoopRun:
    """CPU timings of one run (this thread's CPU time, so other processes do not count).

    ``step_overheads_s``: the loop's time between one model call and the next, for each
    step that ran tools (model and tool time taken out).
    """

    steps: int
    tool_calls: int
    wall_s: float
    cpu_s: float
    model_s: float
    tool_s: float
    step_overheads_s: tuple[float, ...]

    @property
    def overhead_s(self) -> float:
        return self.cpu_s - self.model_s - self.tool_s

    @property
    def overhead_per_step_us(self) -> float:
        return self.overhead_s / self.steps * 1e6

    @property
    def setup_s(self) -> float:
        """What the run cost outside its steps: building the loop, before and after."""
        return self.overhead_s - sum(self.step_overheads_s)


class _Clock:
    """CPU time of this thread, split into model, tool and loop time."""

    def __init__(self) -> None:
        self.model_s = 0.0
        self.tool_s = 0.0
        # (thread CPU time when a model call started, model + tool time before it)
        self.call_starts: list[tuple[float, float]] = []

    def steps(self) -> tuple[float, ...]:
        return tuple(
            (later - earlier) - (busy_later - busy_earlier)
            for (earlier, busy_earlier), (later, busy_later) in itertools.pairwise(self.call_starts)
        )


class _TimedModel(ModelWrapper):
    """Delegates to a model and adds up the CPU time spent inside ``complete``."""

    def __init__(self, model: ScriptedModel, clock: _Clock) -> None:
        super().__init__(model)
        self._clock = clock

    async def complete(self, request: ModelRequest) -> ModelResponse:
        started = time.thread_time()
        clock = self._clock
        clock.call_starts.append((started, clock.model_s + clock.tool_s))
        try:
            return await self._inner.complete(request)
        finally:
            clock.model_s += time.thread_time() - started


class _TimedTool:
    """The tool function; adds up the CPU time spent in its body."""

    def __init__(self, clock: _Clock) -> None:
        self._clock = clock

    def __call__(self, query: str, page: int) -> str:
        started = time.thread_time()
        output = f"{query} page {page}: {TOOL_OUTPUT}"
        self._clock.tool_s += time.thread_time() - started
        return output


def _turns(steps: int, tool_calls_per_step: int) -> list[Turn]:
    turns = [
        Turn(
            tool_calls=[
                ("lookup", {"query": f"step {step} call {call}", "page": call})
                for call in range(tool_calls_per_step)
            ],
            input_tokens=200 + 50 * step,
            output_tokens=30,
        )
        for step in range(steps - 1)
    ]
    turns.append(Turn(text="Here is what I found.", input_tokens=200 + 50 * steps))
    return turns


async def run(steps: int, *, tool_calls_per_step: int = 1) -> LoopRun:
    """One run of ``steps`` model calls (all but the last ask for tools) in a fresh loop."""
    if steps < 1 or tool_calls_per_step < 1:
        raise ValueError("steps and tool_calls_per_step must be at least 1")
    clock = _Clock()
    model = _TimedModel(ScriptedModel(_turns(steps, tool_calls_per_step)), clock)
    tool = _TimedTool(clock)
    toolbox = LocalToolbox(
        [LocalTool(name="lookup", function=tool, input_schema=TOOL_SCHEMA, description="Look.")]
    )
    settings = LoopSettings(
        limits=RunLimits(max_iterations=steps + 1, max_tokens=10**9, max_duration_s=600)
    )
    started_wall, started_cpu = time.perf_counter(), time.thread_time()
    loop = AgentLoop(
        model=model,
        toolbox=toolbox,
        system="You are a benchmark agent.",
        settings=settings,
        task_id="bench-loop",
        agent_id="bench-agent",
        observers=[metrics_observer(JobMetrics(), "bench-agent")],
    )
    result = await loop.run([Message(role="user", content="Find what you can.")])
    cpu_s, wall_s = time.thread_time() - started_cpu, time.perf_counter() - started_wall
    if result.outcome is not Outcome.COMPLETED or result.state.llm_calls != steps:
        raise RuntimeError(f"the benchmark run ended {result.outcome}: {result.detail}")
    return LoopRun(
        steps=steps,
        tool_calls=result.state.tool_calls,
        wall_s=wall_s,
        cpu_s=cpu_s,
        model_s=clock.model_s,
        tool_s=clock.tool_s,
        step_overheads_s=clock.steps(),
    )


class LogTargets:
    """Where this process's log lines go, per ``LogMode``; ``use`` switches between them.

    The pipe is drained by another process, as journald or a container runtime would.
    """

    def __init__(self) -> None:
        self._devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (see close)
        self._drain = subprocess.Popen(
            ["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
        )
        assert self._drain.stdin is not None
        self._pipe = open(  # noqa: SIM115 (see close)
            self._drain.stdin.fileno(), "w", encoding="utf-8", closefd=False
        )
        self._redactor = process_redactor(_FAKE_SECRETS)

    def use(self, mode: LogMode) -> None:
        logs.set_level("critical" if mode is LogMode.OFF else "info")
        logs.set_stream(self._pipe if mode is LogMode.PRODUCTION else self._devnull)
        logs.set_redactor(self._redactor if mode is LogMode.PRODUCTION else str)

    def close(self) -> None:
        logs.set_stream(None)
        logs.set_level("info")
        logs.set_redactor(str)
        self._devnull.close()
        self._pipe.close()
        assert self._drain.stdin is not None
        self._drain.stdin.close()
        self._drain.wait(timeout=10)


@contextmanager
def log_targets() -> Iterator[LogTargets]:
    targets = LogTargets()
    try:
        yield targets
    finally:
        targets.close()


@dataclass(frozen=True)
class _Config:
    mode: LogMode
    steps: int
    tool_calls_per_step: int


async def _measure_interleaved(runs: dict[int, int]) -> dict[_Config, list[LoopRun]]:
    """Runs of every configuration, taken in turns: a slow moment of the machine is
    spread over all of them instead of spoiling one."""
    configs = [
        _Config(mode, steps, width)
        for mode in LogMode
        for steps in STEP_COUNTS
        for width in (1, WIDE_STEP_CALLS)
    ]
    measured: dict[_Config, list[LoopRun]] = {config: [] for config in configs}
    with log_targets() as targets:
        for config in configs:
            targets.use(config.mode)
            for _ in range(WARMUP_RUNS):
                await run(config.steps, tool_calls_per_step=config.tool_calls_per_step)
        for round_index in range(max(runs.values())):
            for config in configs:
                if round_index >= runs[config.steps]:
                    continue
                targets.use(config.mode)
                gc.collect()
                measured[config].append(
                    await run(config.steps, tool_calls_per_step=config.tool_calls_per_step)
                )
    return measured


def _late_step_us(run_: LoopRun) -> float:
    late = run_.step_overheads_s[-LATE_STEPS:]
    return statistics.fmean(late) * 1e6


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    return anyio.run(_benchmark, size)


async def _benchmark(size: Size) -> list[Table]:
    table = Table(
        "loop overhead: CPU µs of the loop per step and per tool call (model and tool excluded)",
        [
            "logging",
            "steps",
            "runs",
            "per step, all-in",
            "min-max",
            "steady step",
            f"last {LATE_STEPS} steps",
            "per tool call",
            "outside steps",
        ],
    )
    runs = {
        steps: size.pick(full=count, quick=max(3, count // 4), smoke=1)
        for steps, count in RUNS.items()
    }
    measured = await _measure_interleaved(runs)
    for mode in LogMode:
        for steps in STEP_COUNTS:
            narrow = measured[_Config(mode, steps, 1)]
            wide = measured[_Config(mode, steps, WIDE_STEP_CALLS)]
            all_in = Summary.of([r.overhead_per_step_us for r in narrow])
            steady = Summary.of([statistics.median(r.step_overheads_s) * 1e6 for r in narrow])
            steady_wide = Summary.of([statistics.median(r.step_overheads_s) * 1e6 for r in wide])
            late = Summary.of([_late_step_us(r) for r in narrow])
            setup = Summary.of([r.setup_s * 1e6 for r in narrow])
            per_call = (steady_wide.median - steady.median) / (WIDE_STEP_CALLS - 1)
            table.add(
                mode.value,
                steps,
                len(narrow),
                *all_in.cells(0),
                f"{steady.median:.0f}",
                f"{late.median:.0f}",
                f"{per_call:.0f}",
                f"{setup.median:.0f}",
            )
    table.notes = [
        "CPU time of this thread (time.thread_time): other processes on the machine do not count,",
        "  though they still slow this one down (shared caches). Configurations run in turns.",
        "per step, all-in: (run - model - tool) / steps, one tool call per step but the last;",
        "  it includes the per-run set-up (loop, dispatcher) and the schema check of each tool",
        "  on first use. steady step: median of one step's loop time (model answer to next",
        f"  model call, with its tool call). last {LATE_STEPS} steps: the same, at the end of the"
        " run.",
        f"per tool call: marginal, steady steps with {WIDE_STEP_CALLS} calls vs 1. outside steps:",
        "  building the loop, before the first model call and after the last one.",
        "the timer itself (a clock_gettime system call) adds a few µs to each step.",
        "target: < 250 µs per step, flat at 5, 20 and 80 steps.",
    ]
    return [table]
