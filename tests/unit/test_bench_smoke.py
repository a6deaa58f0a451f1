"""The benchmarks' loop run still works: functional only, nothing here is timed."""

from __future__ import annotations

import pytest

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
