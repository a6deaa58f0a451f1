"""What a group of processes costs the machine, read from /proc: CPU time and memory.

Use ``process_tree`` to find every process a launched command became (rq's pool
forks workers, each worker forks a job process per task), then ``tree_usage``
for their CPU seconds and memory at that instant.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after "(comm)" (state first), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int, *, with_children: bool = True) -> float:
    """CPU time (user + system) of a process, plus its waited-for children's; 0 if gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # After "(comm)": state is field 3 of stat(5), so utime (14) is index 11 here.
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    ticks = utime + stime + (cutime + cstime if with_children else 0)
    return ticks / _CLOCK_TICKS


def process_tree(roots: Iterable[int]) -> list[int]:
    """``roots`` and their live descendants, by parent pid (job processes start new sessions)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children[int(fields[1])].append(int(entry.name))
    found: list[int] = []
    pending = list(roots)
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


@dataclass(frozen=True)
class Memory:
    """Memory of a set of processes, in MB.

    ``rss`` counts pages shared between forked processes once per process (it
    overstates a fork-heavy fleet); ``pss`` splits each shared page among its
    sharers (the fleet's real footprint); ``uss`` is memory no other process shares.
    """

    processes: int
    rss_mb: float
    pss_mb: float
    uss_mb: float


def memory(pids: Iterable[int]) -> Memory:
    """Summed memory of ``pids`` from /proc/<pid>/smaps_rollup (processes gone are skipped)."""
    count = 0
    totals = {"Rss": 0, "Pss": 0, "Private_Clean": 0, "Private_Dirty": 0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
                lines = rollup.readlines()
        except OSError:
            continue
        count += 1
        for line in lines:
            name, _, rest = line.partition(":")
            if name in totals:
                totals[name] += int(rest.split()[0])
    return Memory(
        processes=count,
        rss_mb=totals["Rss"] / 1024,
        pss_mb=totals["Pss"] / 1024,
        uss_mb=(totals["Private_Clean"] + totals["Private_Dirty"]) / 1024,
    )


def tree_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds of live processes plus the children each has already reaped.

    Summed over a whole tree this counts every process once: a finished job
    process is in its worker's children time, a running one in its own.
    """
    return sum(cpu_seconds(pid) for pid in pids)


def available_memory_mb() -> float:
    """MemAvailable of the machine: what can still be used without swapping."""
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("MemAvailable missing from /proc/meminfo")
