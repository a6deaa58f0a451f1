"""How many tasks one machine keeps in flight when the model is slow, and what that costs.

The scripted endpoint answers every model call after 5 s, so a three-step task
spends 15 s waiting on the model: in-flight capacity, not CPU speed, bounds
throughput. For 50, 200 and 500 target tasks in flight, each mechanism below
runs against the stack (redis-server, devhub, mcp-hub over HTTP, scripted
endpoint) with enough tasks queued to keep every slot busy:

- ``rq worker-pool -n N``: rq 3's pool forking N stock AgentWorkers (fork per
  job) from one parent; and the same from a parent that imported the job modules
  and parsed the configuration before forking (``bench._preloaded_pool``);
- the concurrent worker (``WORKER_CONCURRENCY``), when the code has it: P
  ``rq worker agents`` processes each running N/P tasks at once, and both: the
  preloaded pool of 2 concurrent workers.

Each row samples the tasks in flight (rq's StartedJobRegistry) every second, the
memory of every worker process including job processes (RSS, PSS, USS from
/proc/<pid>/smaps_rollup), and the CPU seconds of the workers and the servers.
Throughput counts tasks that ended inside the measured window (rq's ended_at);
the ideal is the lower of the latency bound (N / model time per task) and the
CPU bound (cores / CPU seconds per task, all processes). A row stops early, and
says why, before worker memory passes ``BENCH_MEMORY_CAP_MB`` (default 10,000)
or the machine's available memory falls under 3 GB: the machine must not swap.
``BENCH_IN_FLIGHT_KINDS=concurrent`` (``pool``, ``preloaded-pool``, ``pool-concurrent``,
``agent-worker-pool``)
runs some kinds only,
``BENCH_IN_FLIGHT_TARGETS=200,500`` other targets.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rq.registry import StartedJobRegistry

from bench._fleet import QUEUE, Mechanism, forget_runs, mechanisms, start_fleet, stop_fleet
from bench._procs import Memory, available_memory_mb, memory, process_tree, tree_cpu_seconds
from bench._report import Table, calibration_ns
from bench._size import Size
from bench._stack import (
    BENCH_AGENT,
    STEPS_PER_TASK,
    BenchStack,
    bench_stack,
    parse_events,
    stack_pids,
)

TARGETS = tuple(int(n) for n in os.environ.get("BENCH_IN_FLIGHT_TARGETS", "50,200,500").split(","))
QUICK_TARGETS = (20,)
SMOKE_TARGETS = (2,)
LLM_LATENCY_S = 5.0
RAMP_S = 20.0
SMOKE_RAMP_S = 1.0  # the smoke run proves the row runs: nothing to settle
WINDOW_S = 60.0
QUICK_WINDOW_S = 20.0
SMOKE_WINDOW_S = 2.0
SAMPLE_EVERY_S = 1.0
MEMORY_EVERY_S = 4.0
READY_TIMEOUT_S = 240.0
MEMORY_CAP_MB = float(os.environ.get("BENCH_MEMORY_CAP_MB", "10000"))
MIN_AVAILABLE_MB = 3_000.0


@dataclass
class RowResult:
    """What one mechanism did at one target."""

    target: int
    in_flight: list[int] = field(default_factory=list)
    peak_memory: Memory | None = None
    window: tuple[float, float] | None = None
    cpu_s: float = 0.0
    # The window's CPU seconds by process: "workers" (with job processes) and each server.
    cpu_s_by_process: dict[str, float] = field(default_factory=dict)
    tasks_per_s: float = 0.0
    cpu_ms_per_task: float = 0.0
    task_s: float = 0.0
    start_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    # The machine as the window ended: other load inflates CPU per task and lowers the share
    # of ideal, so a row is read against it (the header's figures are from the start).
    machine: str = ""
    failed: int = 0
    stopped: str = ""

    def record_memory(self, sample: Memory) -> None:
        if self.peak_memory is None or sample.pss_mb > self.peak_memory.pss_mb:
            self.peak_memory = sample

    def cpu_ms_per_task_by_process(self) -> dict[str, float]:
        """Where a task's CPU went, costliest first: which side grew when the total did."""
        if not self.cpu_s:
            return {}
        ms_per_cpu_s = self.cpu_ms_per_task / self.cpu_s
        shares = sorted(self.cpu_s_by_process.items(), key=lambda item: -item[1])
        return {name: cpu_s * ms_per_cpu_s for name, cpu_s in shares}

    def ideal_per_s(self) -> tuple[float, float]:
        """(latency bound, CPU bound) in tasks per second."""
        latency_bound = self.target / (STEPS_PER_TASK * LLM_LATENCY_S)
        cores = os.cpu_count() or 1
        cpu_bound = cores / (self.cpu_ms_per_task / 1000) if self.cpu_ms_per_task else math.inf
        return latency_bound, cpu_bound


class MemoryCapReached(Exception):
    """The row would take more memory than the machine can spare."""


def _over_cap(sample: Memory) -> str:
    if sample.pss_mb > MEMORY_CAP_MB:
        return f"worker PSS {sample.pss_mb:,.0f} MB passed the cap of {MEMORY_CAP_MB:,.0f} MB"
    available = available_memory_mb()
    if available < MIN_AVAILABLE_MB:
        return f"machine memory available fell to {available:,.0f} MB"
    return ""


def _tasks_needed(target: int, ramp_s: float, window_s: float) -> int:
    """Enough tasks that the queue is not empty before the window ends."""
    return target + math.ceil(target / (STEPS_PER_TASK * LLM_LATENCY_S) * (ramp_s + window_s + 10))


def _wait_ready(
    bench: BenchStack, processes: list[subprocess.Popen[bytes]], expected: int, row: RowResult
) -> None:
    """Until ``expected`` workers have registered with rq (or the start-up time is up).

    Memory is watched meanwhile: N workers starting at once is the peak for some
    mechanisms. Those still starting after READY_TIMEOUT_S are left to start
    during the ramp; the row says how many had registered.
    """
    roots = [process.pid for process in processes]
    started = time.monotonic()
    while (registered := int(bench.redis.scard("rq:workers"))) < expected:
        if time.monotonic() - started > READY_TIMEOUT_S:
            break
        if any(process.poll() is not None for process in processes):
            raise RuntimeError("a worker command exited at start (see its log)")
        sample = memory(process_tree(roots))
        row.record_memory(sample)
        if reason := _over_cap(sample):
            raise MemoryCapReached(f"while starting: {reason}")
        time.sleep(MEMORY_EVERY_S / 2)
    row.start_s = time.monotonic() - started
    if registered < expected:
        row.notes.append(f"{registered} of {expected} workers registered in {row.start_s:.0f} s")


def _sample_window(
    bench: BenchStack, roots: list[int], row: RowResult, ramp_s: float, window_s: float
) -> None:
    """Ramp up, then sample in-flight counts and memory, and CPU over the window."""
    started_key = StartedJobRegistry.key_template.format(QUEUE)
    next_memory = 0.0

    def watch_memory(now: float) -> None:
        nonlocal next_memory
        if now >= next_memory:
            next_memory = now + MEMORY_EVERY_S
            sample = memory(process_tree(roots))
            row.record_memory(sample)
            if reason := _over_cap(sample):
                raise MemoryCapReached(reason)

    ramp_end = time.monotonic() + ramp_s
    while (now := time.monotonic()) < ramp_end:
        watch_memory(now)
        time.sleep(SAMPLE_EVERY_S)
    cpu_start = _cpu_by_process(bench, roots)
    window_from = time.time()
    window_end = time.monotonic() + window_s
    while (now := time.monotonic()) < window_end:
        row.in_flight.append(int(bench.redis.zcard(started_key)))
        watch_memory(now)
        time.sleep(SAMPLE_EVERY_S)
    cpu_end = _cpu_by_process(bench, roots)
    row.cpu_s_by_process = {name: cpu_end[name] - cpu_start.get(name, 0.0) for name in cpu_end}
    row.cpu_s = sum(row.cpu_s_by_process.values())
    row.window = (window_from, time.time())
    row.machine = (
        f"load average {os.getloadavg()[0]:.1f} at the window's end, speed "
        f"{calibration_ns():.0f} ns per loop iteration"
    )


def _cpu_by_process(bench: BenchStack, roots: list[int]) -> dict[str, float]:
    """CPU seconds so far of the workers' trees and of each server of the stack."""
    processes = {"workers": process_tree(roots)}
    processes.update({name: [pid] for name, pid in stack_pids(bench).items()})
    return {name: tree_cpu_seconds(pids) for name, pids in processes.items()}


def _count_window(bench: BenchStack, row: RowResult, window: tuple[float, float]) -> None:
    """Tasks done inside the window, counting each by the share of its run inside it.

    Tasks started together run in waves of 15 s; counting whole tasks that ended
    in a window of a few waves would depend on where the window falls.
    """
    keys = list(bench.redis.scan_iter(match="rq:job:*", count=1000))
    with bench.redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hmget(key, "started_at", "ended_at", "status")
        answers = pipe.execute()
    window_from, window_to = window
    done, durations = 0.0, []
    for started_at, ended_at, status in answers:
        if not (started_at and ended_at):
            continue
        start, end = _epoch(started_at), _epoch(ended_at)
        overlap = min(end, window_to) - max(start, window_from)
        if overlap > 0 and end > start:
            done += overlap / (end - start)
            durations.append(end - start)
            row.failed += status != b"finished"
    row.tasks_per_s = done / (window_to - window_from)
    row.cpu_ms_per_task = row.cpu_s / done * 1000 if done else 0.0
    row.task_s = statistics.median(durations) if durations else 0.0


def _epoch(rq_timestamp: bytes) -> float:
    return datetime.fromisoformat(rq_timestamp.decode().replace("Z", "+00:00")).timestamp()


def _run_row(
    bench: BenchStack, mechanism: Mechanism, target: int, ramp_s: float, window_s: float
) -> RowResult:
    row = RowResult(target=target)
    with tempfile.TemporaryDirectory(prefix="bench-in-flight-") as logdir:
        processes = start_fleet(bench, mechanism, target, Path(logdir))
        try:
            _wait_ready(bench, processes, mechanism.registered_workers(target), row)
            # Queued only now: workers that start early would otherwise compete with
            # those still starting, and seeding is no part of the measure.
            bench.seed(_tasks_needed(target, ramp_s, window_s))
            roots = [process.pid for process in processes]
            _sample_window(bench, roots, row, ramp_s, window_s)
        except MemoryCapReached as reason:
            row.stopped = str(reason)
        finally:
            stop_fleet(bench, processes)
        row.notes += _failure_reasons(Path(logdir))
    if row.window is not None:
        _count_window(bench, row, row.window)
    forget_runs(bench)
    return row


def _failure_reasons(logdir: Path, shown: int = 3) -> list[str]:
    """The commonest reasons of the row's failed tasks, from the workers' task_failed events."""
    reasons: Counter[str] = Counter()
    for log in logdir.glob("*.log"):
        for event in parse_events(log.read_text(errors="replace")):
            if event.get("event") == "task_failed":
                error = event.get("error") or {}
                detail = str(error.get("message", ""))[:100] if isinstance(error, dict) else ""
                reasons[f"{event.get('outcome')}/{event.get('code')}: {detail}"] += 1
    return [f"{count} failed: {reason}" for reason, count in reasons.most_common(shown)]


def _would_exceed(previous: RowResult | None, target: int) -> str:
    """Why the next target is skipped, predicted from the last row's memory per slot."""
    if previous is None or previous.peak_memory is None:
        return ""
    predicted = previous.peak_memory.pss_mb / previous.target * target
    if previous.stopped or predicted > MEMORY_CAP_MB:
        return f"skipped: about {predicted:,.0f} MB PSS predicted from {previous.target} in flight"
    return ""


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    targets = size.pick(full=TARGETS, quick=QUICK_TARGETS, smoke=SMOKE_TARGETS)
    window_s = size.pick(full=WINDOW_S, quick=QUICK_WINDOW_S, smoke=SMOKE_WINDOW_S)
    ramp_s = size.pick(full=RAMP_S, quick=RAMP_S, smoke=SMOKE_RAMP_S)
    results: list[tuple[Mechanism, RowResult]] = []
    with bench_stack(llm_latency_s=LLM_LATENCY_S) as bench:
        forget_runs(bench)
        for mechanism in mechanisms():
            previous: RowResult | None = None
            for target in targets:
                if reason := _would_exceed(previous, target):
                    results.append((mechanism, RowResult(target=target, stopped=reason)))
                    continue
                previous = _run_row(bench, mechanism, target, ramp_s, window_s)
                results.append((mechanism, previous))
                _progress(mechanism, previous)
    return [_table(results, ramp_s, window_s)]


def _progress(mechanism: Mechanism, row: RowResult) -> None:
    """One line per row on stderr: a full run takes minutes."""
    in_flight = statistics.median(row.in_flight) if row.in_flight else 0
    print(
        f"   in_flight: {mechanism.label} at {row.target}: {in_flight:.0f} in flight, "
        f"{row.tasks_per_s:.2f} tasks/s {row.stopped}",
        file=sys.stderr,
        flush=True,
    )


def _table(results: Sequence[tuple[Mechanism, RowResult]], ramp_s: float, window_s: float) -> Table:
    table = Table(
        f"in flight: {STEPS_PER_TASK}-step tasks, scripted model at {LLM_LATENCY_S:.0f} s per "
        f"call, agent {BENCH_AGENT}",
        [
            "mechanism",
            "target",
            "in flight median",
            "min",
            "RSS MB",
            "PSS MB",
            "processes",
            "start s",
            "task s",
            "tasks/s",
            "latency bound",
            "CPU bound",
            "of ideal",
            "CPU ms/task",
        ],
    )
    for mechanism, row in results:
        if row.stopped and not row.in_flight:
            table.add(mechanism.label, row.target, row.stopped, *[""] * 11)
            continue
        latency_bound, cpu_bound = row.ideal_per_s()
        ideal = min(latency_bound, cpu_bound)
        peak = row.peak_memory or Memory(0, 0.0, 0.0, 0.0)
        table.add(
            mechanism.label,
            row.target,
            f"{statistics.median(row.in_flight):.0f}" if row.in_flight else "-",
            min(row.in_flight, default="-"),
            f"{peak.rss_mb:,.0f}",
            f"{peak.pss_mb:,.0f}",
            peak.processes,
            f"{row.start_s:.0f}",
            f"{row.task_s:.1f}",
            f"{row.tasks_per_s:.2f}",
            f"{latency_bound:.2f}",
            f"{cpu_bound:.2f}",
            f"{row.tasks_per_s / ideal * 100:.0f}%" if ideal else "-",
            f"{row.cpu_ms_per_task:.0f}",
        )
        if row.stopped:
            table.notes.append(f"{mechanism.label} at {row.target}: stopped early, {row.stopped}")
        table.notes += [f"{mechanism.label} at {row.target}: {note}" for note in row.notes]
        if row.machine:
            table.notes.append(f"{mechanism.label} at {row.target}: {row.machine}")
        if row.cpu_ms_per_task:
            split = ", ".join(
                f"{name} {ms:.0f}" for name, ms in row.cpu_ms_per_task_by_process().items()
            )
            table.notes.append(
                f"{mechanism.label} at {row.target}: CPU ms/task by process: {split}"
            )
        if row.failed:
            table.notes.append(f"{mechanism.label} at {row.target}: {row.failed} task(s) failed")
    table.notes += _explanations(ramp_s, window_s)
    return table


def _explanations(ramp_s: float, window_s: float) -> list[str]:
    return [
        f"window {window_s:.0f} s after a {ramp_s:.0f} s ramp; tasks/s counts each task by the "
        "share of its run inside the window; task s: median started-to-ended; start s: until "
        "every worker had registered with rq.",
        "memory: the peak PSS sample of every worker process incl. job processes (RSS counts "
        "pages shared after fork once per process).",
        f"latency bound: target / ({STEPS_PER_TASK} x {LLM_LATENCY_S:.0f} s); CPU bound: "
        f"{os.cpu_count()} cores / CPU seconds per task (workers, job processes, devhub, MCP "
        "servers, scripted endpoint, redis); of ideal: tasks/s / the lower bound.",
        "the machine is shared: other load lowers the CPU bound these numbers assume.",
    ]
