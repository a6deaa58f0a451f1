"""A task group for background tasks that never raise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskGroup


@asynccontextmanager
async def background_task_group() -> AsyncIterator[TaskGroup]:
    """Use when the tasks started in the group never raise (they keep their own errors).

    Whatever the block raises then comes out as itself, not wrapped in an exception group,
    so callers catch it as they would without the group.
    """
    raised_in_block: BaseException | None = None
    try:
        async with anyio.create_task_group() as group:
            yield group
    except BaseExceptionGroup as wrapped:
        if len(wrapped.exceptions) != 1:
            raise
        raised_in_block = wrapped.exceptions[0]
    if raised_in_block is not None:
        raise raised_in_block
