"""The tool boundary's redaction: no known secret crosses it, in either direction.

The model never sees a known secret (``ModelBoundary`` masks them), but a secret it got
some other way could still be posted through ``hub__create_post`` or sent off in a
``web__fetch`` URL; and a tool may answer with one, which would then be kept in the
task's checkpoint in Redis and in its report. ``ArgumentRedactingToolbox`` masks every
string in a call's arguments right before the call leaves, and the result (or the
failure's message) as it comes back, spelled-out values included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from worker.exceptions import ToolFailed
from worker.logs import log_event
from worker.tools import CallContext, Toolbox, ToolboxWrapper, ToolResult

Redact = Callable[[str], str]


class ArgumentRedactingToolbox(ToolboxWrapper):
    """A toolbox whose calls go out, and whose results come back, with known secrets masked."""

    def __init__(self, inner: Toolbox, redact: Redact) -> None:
        super().__init__(inner)
        self._redact = redact

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        masked = _masked(arguments, self._redact)
        if masked != arguments:
            # A model that writes a secret into a tool call is worth an operator's look.
            log_event(
                "tool_arguments_redacted",
                "warning",
                task=ctx.task_id,
                agent=ctx.agent_id,
                tool=name,
                step=ctx.step,
            )
        try:
            result = await self._inner.call(name, masked, ctx)
        except ToolFailed as failure:
            failure.message = self._redact(failure.message)
            failure.args = (failure.message,)
            raise
        return dataclasses.replace(result, content=self._redact(result.content))


def redacting_arguments(
    open_toolbox: Callable[[], AbstractAsyncContextManager[Toolbox]], redact: Redact
) -> Callable[[], AbstractAsyncContextManager[Toolbox]]:
    """``open_toolbox``, its toolbox wrapped in an ArgumentRedactingToolbox."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Toolbox]:
        async with open_toolbox() as toolbox:
            yield ArgumentRedactingToolbox(toolbox, redact)

    return opened


def _masked(value: Any, redact: Redact) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _masked(item, redact) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, redact) for item in value]
    return value
