"""A call's timeout behaves as ``anyio.fail_after`` does, which the loop used before."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from worker.loop._timeout import _deadlines, call_timeout

pytestmark = pytest.mark.anyio


async def test_a_block_past_its_time_is_cancelled_and_raises_timeout_error() -> None:
    reached_the_end = False
    started = anyio.current_time()
    with pytest.raises(TimeoutError), call_timeout(0.05):
        await anyio.sleep(5)
        reached_the_end = True
    assert not reached_the_end
    assert anyio.current_time() - started < 2


async def test_a_block_within_its_time_runs_to_the_end_and_keeps_its_value() -> None:
    with call_timeout(5):
        await anyio.lowlevel.checkpoint()
        value = "done"
    assert value == "done"


async def test_an_error_inside_the_block_passes_through_unchanged() -> None:
    with pytest.raises(ValueError, match="the tool broke"), call_timeout(5):
        raise ValueError("the tool broke")


async def test_an_enclosing_timeout_is_the_enclosing_scopes_not_the_calls() -> None:
    inner_timed_out = False
    with anyio.move_on_after(0.05) as outer:
        try:
            with call_timeout(5):
                await anyio.sleep(5)
        except TimeoutError:
            inner_timed_out = True
    assert outer.cancelled_caught
    assert not inner_timed_out


async def test_the_tighter_of_two_nested_timeouts_fires_and_the_outer_block_goes_on() -> None:
    with call_timeout(5):
        with pytest.raises(TimeoutError), call_timeout(0.05):
            await anyio.sleep(5)
        await anyio.lowlevel.checkpoint()  # the outer scope was not cancelled
        after = "went on"
    assert after == "went on"


async def test_a_timeout_already_due_cancels_the_block_at_its_first_wait() -> None:
    with pytest.raises(TimeoutError), call_timeout(0):
        await anyio.sleep(5)


def test_a_nan_timeout_is_refused_as_a_cancel_scope_refuses_it() -> None:
    with pytest.raises(ValueError, match="NaN"):
        call_timeout(float("nan"))


async def test_each_of_many_concurrent_calls_ends_by_its_own_deadline_or_its_own_work() -> None:
    """The calls of many tasks share one event-loop timer: a shorter deadline opened after a
    longer one still fires first, and every long call that was not due runs to its end."""
    outcomes: dict[str, str] = {}
    short_ones_done = anyio.Event()
    shorts = [f"short-{n}" for n in range(10)]

    async def call(name: str, delay_s: float, until: anyio.Event | None) -> None:
        try:
            with call_timeout(delay_s):
                if until is None:
                    await anyio.sleep(30)
                else:
                    await until.wait()
                outcomes[name] = "finished"
        except TimeoutError:
            outcomes[name] = "timed out"
        if all(short in outcomes for short in shorts):
            short_ones_done.set()

    async with anyio.create_task_group() as tasks:
        for n in range(5):  # long ones first: the timer is set for them, then moved earlier
            tasks.start_soon(call, f"long-{n}", 30 + n, short_ones_done)
        for n, short in enumerate(shorts):
            tasks.start_soon(call, short, 0.01 * (10 - n), None)
    assert outcomes == {
        **{short: "timed out" for short in shorts},
        **{f"long-{n}": "finished" for n in range(5)},
    }


async def test_calls_that_end_in_time_leave_nothing_behind_and_a_later_one_still_fires() -> None:
    for _ in range(500):
        with call_timeout(30):
            await anyio.lowlevel.checkpoint()
    # Ended timeouts are dropped as they pile up: a long run does not grow the heap.
    assert len(_deadlines(asyncio.get_running_loop())._heap) < 200
    with pytest.raises(TimeoutError), call_timeout(0.01):
        await anyio.sleep(30)
