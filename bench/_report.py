"""Plain-text tables, summary statistics over repeated runs, and what machine ran them."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata


@dataclass(slots=True, frozen=True)
class Summary:
    """Median and spread (min, max) of one quantity over repeated runs."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("a summary needs at least one value")
        return cls(
            median=statistics.median(values), low=min(values), high=max(values), runs=len(values)
        )

    def cells(self, digits: int = 1) -> list[str]:
        """median, min-max: the two columns every table shows for a measured quantity."""
        return [f"{self.median:.{digits}f}", f"{self.low:.{digits}f}-{self.high:.{digits}f}"]


@dataclass(slots=True)
class Table:
    """One benchmark's result: a title, plain-text columns, and notes printed under it."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([str(cell) for cell in cells])

    def render(self) -> str:
        widths = [
            max(len(column), *(len(row[i]) for row in self.rows)) if self.rows else len(column)
            for i, column in enumerate(self.columns)
        ]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))

        out = [f"== {self.title}", line(self.columns), line(["-" * w for w in widths])]
        out.extend(line(row) for row in self.rows)
        out.extend(f"   {note}" for note in self.notes)
        return "\n".join(text.rstrip() for text in out)


def machine_info() -> list[str]:
    """Lines describing where the numbers come from (they mean little without it)."""
    cpu = _cpu_model()
    memory_mb = _memory_mb()
    redis = _redis_version()
    packages = ", ".join(
        f"{name} {_version(name)}"
        for name in ("rq", "redis", "mcp", "httpx2", "anyio", "prometheus-client", "jsonschema")
    )
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return [
        f"python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"cpu: {cpu}, {os.cpu_count()} logical cores; memory: {memory_mb} MB",
        f"load average (1, 5, 15 min): {load}; speed: {calibration_ns():.0f} ns per iteration of "
        "a plain Python loop (CPU time; lower is faster)",
        f"redis-server: {redis}",
        f"packages: {packages}",
    ]


def calibration_ns() -> float:
    """CPU nanoseconds per iteration of a fixed pure-Python loop: how fast this machine is."""
    iterations = 2_000_000
    best = float("inf")
    for _ in range(3):
        started = time.thread_time()
        total = 0
        for value in range(iterations):
            total += value
        best = min(best, time.thread_time() - started)
    return best / iterations * 1e9


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_mb() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return str(int(line.split()[1]) // 1024)
    except OSError:
        pass
    return "unknown"


def _redis_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "not installed"
    completed = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=False, timeout=10
    )
    for part in completed.stdout.split():
        if part.startswith("v="):
            return part[2:]
    return completed.stdout.strip() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"
