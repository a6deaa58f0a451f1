"""A call's timeout behaves as ``anyio.fail_after`` does, which the loop used before."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from worker.loop._timeout import call_timeout

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
