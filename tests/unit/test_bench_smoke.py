"""The benchmarks' loop run still works: functional only, nothing here is timed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench._procs import memory, process_tree, tree_cpu_seconds
from bench.in_flight import RowResult
from bench.loop_overhead import LoopRun, run


@pytest.mark.anyio
async def test_a_five_step_loop_run_completes_and_accounts_for_its_time() -> None:
    result = await run(5)

    assert isinstance(result, LoopRun)
    assert result.steps == 5
    assert result.tool_calls == 4  # every step but the last asks for one tool call
    assert len(result.step_overheads_s) == 4  # one measured step per model call after the first
    assert result.model_s > 0 and result.tool_s > 0
    assert result.cpu_s >= result.model_s + result.tool_s


@pytest.mark.anyio
async def test_wider_steps_run_every_requested_tool_call() -> None:
    result = await run(3, tool_calls_per_step=3)

    assert result.tool_calls == 6


def test_process_tree_finds_a_child_and_reads_its_memory_and_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree([os.getpid()])
        used = memory([child.pid])

        assert child.pid in tree
        assert used.processes == 1
        assert used.rss_mb >= used.pss_mb >= used.uss_mb > 0
        assert tree_cpu_seconds(tree) > 0
    finally:
        child.kill()
        child.wait()


def test_an_in_flight_row_splits_its_cpu_per_task_by_process_costliest_first() -> None:
    row = RowResult(target=50, cpu_s_by_process={"devhub": 1.0, "workers": 9.0, "redis": 0.0})
    row.cpu_s = 10.0
    row.cpu_ms_per_task = 100.0  # 100 tasks in the window

    split = row.cpu_ms_per_task_by_process()

    assert list(split) == ["workers", "devhub", "redis"]
    assert split == pytest.approx({"workers": 90.0, "devhub": 10.0, "redis": 0.0})


def test_an_in_flight_row_without_cpu_has_no_split() -> None:
    assert RowResult(target=50).cpu_ms_per_task_by_process() == {}
