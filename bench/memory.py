"""Memory of an idle worker parent and of each job process, with and without preloading.

Read from ``/proc/<pid>/smaps_rollup``: Rss (resident), Pss (resident, shared
pages split between the processes sharing them) and private memory
(Private_Clean + Private_Dirty: what the process alone holds, what one more job
process really costs). Job processes are sampled every 20 ms while they run
(the scripted model answers after 500 ms, so each lives a couple of seconds);
each one's peak private memory counts.

Two workers: the stock AgentWorker, which imports the job modules, parses the
configuration and warms the SDKs up before it forks (job processes share those
pages), and ``NoPreloadWorker``, which does none of that in the parent.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

from bench._report import Summary, Table
from bench._size import Size
from bench._stack import BenchStack, bench_stack, job_times, require_completed, running_workers

LLM_LATENCY_S = 0.5
TASKS = 4
IDLE_SETTLE_S = 2.0
SAMPLE_EVERY_S = 0.02
JOB_WAIT_S = 300
VARIANTS = (
    ("AgentWorker (preloads)", "worker.AgentWorker"),
    ("without preloading", "bench._workers.NoPreloadWorker"),
)


@dataclass(frozen=True)
class Memory:
    """Megabytes from smaps_rollup."""

    rss: float
    pss: float
    private: float

    @classmethod
    def of(cls, pid: int) -> Memory | None:
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
                lines = rollup.read().splitlines()
        except OSError:
            return None
        kilobytes = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            kilobytes[name] = int(value.split()[0])
        return cls(
            rss=kilobytes["Rss"] / 1024,
            pss=kilobytes["Pss"] / 1024,
            private=(kilobytes["Private_Clean"] + kilobytes["Private_Dirty"]) / 1024,
        )


@dataclass
class VariantMemory:
    idle_parent: Memory
    parent_after_jobs: Memory
    job_peaks: list[Memory] = field(default_factory=list)


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.add(int(entry))
    return found


def _measure(bench: BenchStack, worker_class: str, tasks: int) -> VariantMemory:
    env = bench.worker_env(RQ_WORKER_CLASS=worker_class)
    with running_workers(env, 1, bench.redis) as pool:
        parent = pool.pids[0]
        time.sleep(IDLE_SETTLE_S)
        idle = Memory.of(parent)
        # rq's scheduler is a child of the parent too; job processes are the new ones.
        not_jobs = _children(parent)
        ids = [task["task_id"] for task in bench.seed(tasks)]
        peaks: dict[int, Memory] = {}
        deadline = time.monotonic() + JOB_WAIT_S
        while not _all_done(bench, ids):
            for pid in _children(parent) - not_jobs:
                sample = Memory.of(pid)
                if sample is not None and (pid not in peaks or sample.private > peaks[pid].private):
                    peaks[pid] = sample
            if time.monotonic() > deadline:
                raise RuntimeError("memory benchmark: tasks did not finish")
            time.sleep(SAMPLE_EVERY_S)
        time.sleep(IDLE_SETTLE_S)
        after = Memory.of(parent)
    require_completed(job_times(bench.redis, ids))
    if idle is None or after is None:
        raise RuntimeError("the worker parent vanished while being measured")
    return VariantMemory(idle_parent=idle, parent_after_jobs=after, job_peaks=list(peaks.values()))


def _all_done(bench: BenchStack, ids: list[str]) -> bool:
    with bench.redis.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hget(f"rq:job:{job_id}", "status")
        return all(status in (b"finished", b"failed") for status in pipe.execute())


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    tasks = size.pick(full=TASKS, quick=2, smoke=1)
    results = {}
    with bench_stack(llm_latency_s=LLM_LATENCY_S) as bench:
        for _label, worker_class in VARIANTS:
            results[worker_class] = _measure(bench, worker_class, tasks)
    table = Table(
        "memory: worker parent and job processes, MB (smaps_rollup)",
        [
            "worker",
            "idle parent Rss",
            "Pss",
            "private",
            "parent after jobs Rss",
            "jobs",
            "job private median",
            "min-max",
            "job Rss",
            "job Pss",
        ],
    )
    for label, worker_class in VARIANTS:
        measured = results[worker_class]
        if not measured.job_peaks:
            raise RuntimeError(f"{label}: no job process was sampled")
        private = Summary.of([peak.private for peak in measured.job_peaks])
        table.add(
            label,
            f"{measured.idle_parent.rss:.1f}",
            f"{measured.idle_parent.pss:.1f}",
            f"{measured.idle_parent.private:.1f}",
            f"{measured.parent_after_jobs.rss:.1f}",
            len(measured.job_peaks),
            *private.cells(1),
            f"{statistics.median(p.rss for p in measured.job_peaks):.1f}",
            f"{statistics.median(p.pss for p in measured.job_peaks):.1f}",
        )
    table.notes = [
        "job: each job process's peak private memory (Private_Clean + Private_Dirty) while it",
        f"  runs a 3-step task (sampled every {SAMPLE_EVERY_S * 1000:.0f} ms); Rss and Pss at that "
        "peak.",
        "targets: idle parent Rss < 150 MB; job process < 50 MB private.",
    ]
    return [table]
