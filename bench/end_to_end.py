"""Tasks per second through the real thing, and where a task's time goes.

Real redis-server, a real ``rq worker agents --burst`` (AgentWorker), our hub MCP
server over HTTP, the devhub, and the scripted OpenAI-compatible endpoint with no
added latency. Each task is a three-step notification (two Hub tools, then the
answer, posted as a comment). Each run seeds fresh tasks and starts a fresh
worker; the first tasks of a run are warm-up and not counted.

Throughput is measured for the stock AgentWorker (fork per job, the default),
the same with phase timers (``bench._workers``), an in-process variant that does
not fork (with and without phase timers), and, where the code has it, the
concurrent worker (``WORKER_CONCURRENCY``, several tasks at once in threads).
The per-task breakdowns, forking and in-process, come from the phase-timed runs:
rq's job timestamps, the worker's JSON events (``task_started``, ``llm_call``,
``tool_call``, ``task_completed`` with their durations) and the ``bench_phase``
events.

The last table is the CPU a task costs the worker with tracing off (no OTEL_* set: the
OpenTelemetry API alone) and on (the SDK with the always-on sampler, exporting over
OTLP/HTTP to a receiver in this process), in both worker modes (fork per job, and
WORKER_CONCURRENCY): the worker's and its job processes' CPU time, read from /proc
between the end of the warm-up tasks and the end of the measured ones.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench._procs import cpu_seconds
from bench._report import Summary, Table
from bench._size import Size
from bench._stack import (
    WORKER_RUN_TIMEOUT_S,
    BenchStack,
    WorkerRun,
    bench_stack,
    event_time,
    has_concurrent_worker,
    job_times,
    require_completed,
    run_burst_workers,
    running_workers,
    wait_for_jobs,
)
from worker.dev.otlp_receiver import OtlpReceiver, running_otlp_receiver

WARMUP_TASKS = 2
MEASURED_TASKS = 15
RUNS = 3
STOCK = "worker.AgentWorker"
PHASE_TIMED = "bench._workers.PhaseTimedWorker"
IN_PROCESS = "bench._workers.InProcessAgentWorker"
PHASE_TIMED_IN_PROCESS = "bench._workers.PhaseTimedInProcessWorker"
CONCURRENCY = 4
# Tracing's cost is a few per cent of a task's CPU, and one run's CPU per task varies by
# about as much: more runs of more tasks than the throughput table.
TRACING_RUNS = 5
TRACING_TASKS = 40


@dataclass(frozen=True)
class Variant:
    """A worker class and the settings it runs with."""

    label: str
    worker_class: str
    env: tuple[tuple[str, str], ...] = ()


def variants() -> list[Variant]:
    found = [
        Variant("AgentWorker, fork per job (default)", STOCK),
        Variant("same, with phase timers", PHASE_TIMED),
        Variant("AgentWorker in-process (no fork)", IN_PROCESS),
        Variant("same, with phase timers", PHASE_TIMED_IN_PROCESS),
    ]
    if has_concurrent_worker():
        found.append(
            Variant(
                f"AgentWorker, WORKER_CONCURRENCY={CONCURRENCY}",
                STOCK,
                (("WORKER_CONCURRENCY", str(CONCURRENCY)),),
            )
        )
    return found


# Phases of the breakdown, in the order a task meets them.
PHASES = (
    ("parent: dequeue to fork", "between jobs: dequeue, allow-list check, rq bookkeeping"),
    ("fork + child start", "fork() until the job process runs"),
    ("child: rq start to task_started", "rq job start, runtime and Hub client set-up"),
    ("agent load", "agent definition (Redis cache)"),
    ("MCP session set-up", "McpToolbox.open: connect, initialize, list tools"),
    ("Hub calls (direct)", "budget, thread, comment, read mark, consumption, activation"),
    ("model calls", "llm_call durations: SDK + HTTP + scripted endpoint"),
    ("tool calls (Hub via MCP)", "tool_call durations"),
    ("MCP session close", "closing the toolbox"),
    ("loop and glue", "what is left between task_started and task_completed"),
    ("child: task_completed to exit", "outbox drain, metrics flush, rq result, exit"),
    ("parent: after the job", "apply job metrics, reap child groups, requeue check"),
)


@dataclass
class VariantRun:
    """One burst worker's measured tasks."""

    tasks_per_s: float
    model_ms_per_task: float
    events: list[dict[str, Any]] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)

    @property
    def cycle_ms(self) -> float:
        return 1000 / self.tasks_per_s

    @property
    def overhead_ms(self) -> float:
        return self.cycle_ms - self.model_ms_per_task


def _one_run(bench: BenchStack, variant: Variant, measured: int) -> VariantRun:
    tasks = bench.seed(WARMUP_TASKS + measured)
    ids = [task["task_id"] for task in tasks]
    env = bench.worker_env(RQ_WORKER_CLASS=variant.worker_class, **dict(variant.env))
    runs: list[WorkerRun] = run_burst_workers(env, 1)
    if runs[0].returncode != 0:
        raise RuntimeError(f"{variant.label} exited with {runs[0].returncode}")
    times = sorted(job_times(bench.redis, ids), key=lambda t: t.ended_at)
    require_completed(times)
    span_s = times[-1].ended_at - times[WARMUP_TASKS - 1].ended_at
    counted = {t.job_id for t in times[WARMUP_TASKS:]}
    model_ms = [
        sum(e["duration_ms"] for e in runs[0].events if _is(e, "llm_call", task_id))
        for task_id in counted
    ]
    return VariantRun(
        tasks_per_s=measured / span_s,
        model_ms_per_task=statistics.fmean(model_ms),
        events=runs[0].events,
        task_ids=[t.job_id for t in times[WARMUP_TASKS:]],
    )


def _is(event: Mapping[str, Any], name: str, task_id: str) -> bool:
    return event.get("event") == name and event.get("task") == task_id


def _phase_ms(run: VariantRun) -> dict[str, list[float]]:
    """Per phase, its milliseconds in each measured task of a phase-timed run."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    parent: dict[tuple[str, str], dict[str, Any]] = {}
    for event in run.events:
        if event.get("event") == "bench_phase" and "job" in event:
            parent[(event["phase"], event["job"])] = event
        elif event.get("task"):
            by_task[str(event["task"])].append(event)
    previous_end: float | None = None
    phases: dict[str, list[float]] = defaultdict(list)
    for task_id in run.task_ids:
        events = by_task[task_id]

        def phase(name: str) -> list[dict[str, Any]]:
            return [e for e in events if e.get("event") == "bench_phase" and e["phase"] == name]  # noqa: B023

        def named(name: str) -> list[dict[str, Any]]:
            return [e for e in events if e.get("event") == name]  # noqa: B023

        job_total = parent[("parent_job_total", task_id)]
        job_start = job_total["at"] - job_total["duration_ms"] / 1000
        fork = phase("fork_to_child")[0]
        fork_start = fork["at"] - fork["duration_ms"] / 1000
        started = event_time(named("task_started")[0])
        completed = event_time(named("task_completed")[0])
        exited = phase("child_exited")[0]["at"]
        inside = {
            "agent load": sum(e["duration_ms"] for e in phase("agent_load")),
            "MCP session set-up": sum(e["duration_ms"] for e in phase("mcp_open")),
            "Hub calls (direct)": sum(e["duration_ms"] for e in phase("hub_call")),
            "model calls": sum(e["duration_ms"] for e in named("llm_call")),
            "tool calls (Hub via MCP)": sum(e["duration_ms"] for e in named("tool_call")),
            "MCP session close": sum(e["duration_ms"] for e in phase("mcp_close")),
        }
        measured = {
            "fork + child start": fork["duration_ms"],
            "child: rq start to task_started": (started - fork["at"]) * 1000,
            **inside,
            "loop and glue": (completed - started) * 1000 - sum(inside.values()),
            "child: task_completed to exit": (exited - completed) * 1000,
            "parent: after the job": (job_total["at"] - exited) * 1000,
        }
        pre_fork = (fork_start - job_start) * 1000
        if previous_end is not None:
            pre_fork += (job_start - previous_end) * 1000
        previous_end = job_total["at"]
        if task_id == run.task_ids[0]:
            continue  # its time before the fork includes the last warm-up task's tail
        phases["parent: dequeue to fork"].append(pre_fork)
        for name, value in measured.items():
            phases[name].append(value)
    return phases


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    runs_per_variant = size.pick(full=RUNS, quick=1, smoke=1)
    # Two at least: the breakdown leaves out the first measured task (warm-up's tail).
    measured = size.pick(full=MEASURED_TASKS, quick=6, smoke=2)
    results: dict[Variant, list[VariantRun]] = defaultdict(list)
    with bench_stack() as bench:
        for _ in range(runs_per_variant):
            for variant in variants():
                results[variant].append(_one_run(bench, variant, measured))
    throughput = Table(
        "end to end: 3-step notification tasks, one worker, zero-latency scripted model",
        [
            "worker",
            "runs x tasks",
            "tasks/s median",
            "min-max",
            "ms per task",
            "model ms",
            "overhead ms",
        ],
    )
    for variant, runs in results.items():
        rate = Summary.of([r.tasks_per_s for r in runs])
        cycle = statistics.median(r.cycle_ms for r in runs)
        model = statistics.median(r.model_ms_per_task for r in runs)
        overhead = Summary.of([r.overhead_ms for r in runs])
        throughput.add(
            variant.label,
            f"{len(runs)} x {measured}",
            *rate.cells(2),
            f"{cycle:.0f}",
            f"{model:.0f}",
            # Overlapping tasks share the model's time: cycle - model time means nothing.
            f"{overhead.median:.0f} ({overhead.low:.0f}-{overhead.high:.0f})"
            if not variant.env
            else "n/a: tasks overlap",
        )
    throughput.notes = [
        "tasks/s: measured tasks / (last ended_at - ended_at of the last warm-up task), rq's",
        "  timestamps. overhead = ms per task - model ms (sum of the task's llm_call durations).",
        "target: overhead (everything but model time) <= 50 ms per task. With several tasks at",
        "  once (WORKER_CONCURRENCY) ms per task is the machine's time per task, not one task's;",
        "  each task runs in-process there, as in the in-process rows.",
    ]
    timed = {variant.worker_class: runs for variant, runs in results.items()}
    with bench_stack() as bench:
        warm_up = size.pick(full=WARMUP_TASKS, quick=WARMUP_TASKS, smoke=0)
        tracing = _tracing_cpu_table(
            bench,
            size.pick(full=TRACING_RUNS, quick=1, smoke=1),
            size.pick(full=TRACING_TASKS, quick=6, smoke=2),
            warm_up,
        )
    return [
        throughput,
        _breakdown_table(timed[PHASE_TIMED], "phase-timed AgentWorker, fork per job"),
        _breakdown_table(timed[PHASE_TIMED_IN_PROCESS], "phase-timed AgentWorker, in-process"),
        tracing,
    ]


def _window_cpu_s(bench: BenchStack, env: dict[str, str], warm_up: int, measured: int) -> float:
    """CPU seconds one worker and its job processes spend on ``measured`` tasks.

    Read from /proc while the worker runs: from the end of its ``warm_up`` tasks to the end
    of the measured ones, so its start-up and shutdown stay out. A last task keeps the
    worker busy past them: once it has started, the last measured job process has been
    reaped, and its CPU counted (cutime).
    """
    warm_ids = [task["task_id"] for task in bench.seed(warm_up)]
    measured_ids = [task["task_id"] for task in bench.seed(measured)]
    (tail,) = [task["task_id"] for task in bench.seed(1)]
    with running_workers(env, 1, bench.redis) as pool:
        (pid,) = pool.pids
        wait_for_jobs(bench.redis, warm_ids, timeout_s=WORKER_RUN_TIMEOUT_S)
        before = cpu_seconds(pid)
        wait_for_jobs(bench.redis, measured_ids, timeout_s=WORKER_RUN_TIMEOUT_S)
        while bench.redis.hget(f"rq:job:{tail}", "status") in (None, b"queued"):
            time.sleep(0.01)
        spent = cpu_seconds(pid) - before
        wait_for_jobs(bench.redis, [tail], timeout_s=WORKER_RUN_TIMEOUT_S)
    require_completed(job_times(bench.redis, [*warm_ids, *measured_ids, tail]))
    return spent


def _tracing_env(bench: BenchStack, receiver: OtlpReceiver | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in bench.worker_env(**extra).items() if not k.startswith("OTEL_")}
    if receiver is not None:
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_TRACES_SAMPLER": "always_on",
            # A batch every second (the SDK's default is 5 s): exports fall inside the
            # measured window, and a request carries fewer spans than in production.
            "OTEL_BSP_SCHEDULE_DELAY": "1000",
        }
    return env


# The worker modes tracing is measured in: a forked job process per task, and tasks in
# job threads of the worker process.
TRACING_MODES: dict[str, dict[str, str]] = {
    "fork per job": {},
    f"WORKER_CONCURRENCY={CONCURRENCY}": {"WORKER_CONCURRENCY": str(CONCURRENCY)},
}
TRACING_OFF = "off (no OTEL_* set)"
TRACING_ON = "on (always_on, OTLP/HTTP, batch every 1 s)"


def _tracing_cpu_table(bench: BenchStack, runs: int, measured: int, warm_up: int) -> Table:
    """CPU per task with tracing off and on, in each worker mode, off and on in turns."""
    per_task_ms: dict[tuple[str, str], list[float]] = defaultdict(list)
    spans_per_task: list[float] = []
    with running_otlp_receiver() as receiver:
        for _ in range(runs):
            for mode, mode_env in TRACING_MODES.items():
                for label, exporting_to in ((TRACING_OFF, None), (TRACING_ON, receiver)):
                    env = _tracing_env(bench, exporting_to, **mode_env)
                    receiver.clear()
                    spent = _window_cpu_s(bench, env, warm_up, measured)
                    per_task_ms[(mode, label)].append(spent / measured * 1000)
                    if exporting_to is not None:
                        tasks = warm_up + measured + 1  # every span leaves at the worker's stop
                        spans_per_task.append(len(receiver.spans()) / tasks)
    table = Table(
        "tracing: worker CPU per task (3-step notification), off and on side by side",
        ["worker mode", "tracing", "runs x tasks", "CPU ms per task median", "min-max", "vs off"],
    )
    for mode in TRACING_MODES:
        off = statistics.median(per_task_ms[(mode, TRACING_OFF)])
        for label in (TRACING_OFF, TRACING_ON):
            values = per_task_ms[(mode, label)]
            summary = Summary.of(values)
            change = (summary.median - off) / off * 100
            table.add(
                mode, label, f"{len(values)} x {measured}", *summary.cells(1), f"{change:+.1f} %"
            )
    table.notes = [
        "CPU = user + system time of one worker and its job processes (/proc) from the end of",
        f"  {warm_up} warm-up tasks to the end of the measured ones: start-up and shutdown stay",
        "  out. A job process hands its spans to the worker (Redis), which exports them in",
        "  batches across tasks.",
        f"spans exported per task (on): {statistics.fmean(spans_per_task):.0f}; goal: on <= 5 %",
        f"  in both modes. Machine CPUs: {os.cpu_count()}; load at the end: "
        f"{', '.join(f'{load:.1f}' for load in os.getloadavg())}.",
    ]
    return table


def _breakdown_table(runs: Sequence[VariantRun], which: str) -> Table:
    table = Table(
        f"end to end: where one task's time goes ({which}, ms per task)",
        ["phase", "median", "min-max", "share", "what"],
    )
    merged: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for name, values in _phase_ms(run).items():
            merged[name].extend(values)
    medians = {name: statistics.median(merged[name]) for name, _ in PHASES}
    total = sum(medians.values())
    for name, what in PHASES:
        summary = Summary.of(merged[name])
        table.add(name, *summary.cells(1), f"{summary.median / total * 100:.0f}%", what)
    table.add("sum of medians", f"{total:.1f}", "", "100%", "")
    table.notes = [
        "Hub calls (direct) overlap nothing else; tool calls are the MCP server's Hub calls.",
        "fork + child start: the parent's fork() call until main_work_horse runs in the child.",
    ]
    return table
