"""A task's tools, opened while the Hub answers the budget and thread reads.

Opening the MCP sessions (connect, initialize, list tools) and reading the Hub take
about the same time and need nothing of each other: the toolbox opens in the
background as soon as the task's deadline is fixed, and the executor gets it ready.
To the executor nothing changes: ``request.open_toolbox()`` yields the toolbox and
closes it on exit, and a failure to open raises there, as if it had opened it itself.
A task that ends before its executor runs (budget unhealthy, requeued, invalid) closes
the toolbox on its way out, or cancels an opening still under way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio

from worker._task_groups import background_task_group
from worker.tools import Toolbox

ToolboxFactory = Callable[[], AbstractAsyncContextManager[Toolbox]]


class _HeldToolbox:
    """One toolbox held open by a background task until the executor is done with it."""

    def __init__(self, open_toolbox: ToolboxFactory) -> None:
        self._open_toolbox = open_toolbox
        self._opening = anyio.CancelScope()
        self._ready = anyio.Event()  # opened, or failed to
        self._released = anyio.Event()
        self._closed = anyio.Event()
        self._toolbox: Toolbox | None = None
        self._error: Exception | None = None

    async def hold(self) -> None:
        """The background task: open, wait for the release, close."""
        with self._opening:
            try:
                async with self._open_toolbox() as toolbox:
                    self._toolbox = toolbox
                    self._ready.set()
                    await self._released.wait()
            except Exception as exc:  # raised to the executor, where it would have happened
                self._error = exc
        self._ready.set()
        self._closed.set()

    def release(self) -> None:
        """Close the toolbox; an opening still under way is cancelled instead."""
        self._released.set()
        if not self._ready.is_set():
            self._opening.cancel()

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Toolbox]:
        """The executor's ``open_toolbox``: the held toolbox, closed when the block ends."""
        try:
            await self._ready.wait()
            if self._error is not None:
                raise self._error
            assert self._toolbox is not None
            yield self._toolbox
        finally:
            self.release()
            # Closing is bounded by the toolbox itself; a deadline cut must not skip it.
            with anyio.CancelScope(shield=True):
                await self._closed.wait()
        if self._error is not None:
            raise self._error  # the toolbox failed as it closed, after a clean run


@asynccontextmanager
async def tools_opened_early(
    open_toolbox: ToolboxFactory, *, early: bool
) -> AsyncIterator[ToolboxFactory]:
    """The ``open_toolbox`` to hand the executor, opening now when ``early``.

    Use around everything between fixing the deadline and the executor's return. Only
    executors that use the worker's toolbox open early: a CLI runs its own gateway.
    """
    if not early:
        yield open_toolbox
        return
    held = _HeldToolbox(open_toolbox)
    # The holder never raises: what the block raises comes out as it was.
    async with background_task_group() as holder:
        holder.start_soon(held.hold, name="toolbox opened early")
        try:
            yield held.use
        finally:
            held.release()
