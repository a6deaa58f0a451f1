"""The run's clock: one absolute deadline, and what each call may take of the time left."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.tools import CallContext, Toolbox, ToolboxWrapper, ToolResult

# Below this a closing call could not get an answer back; the fallback text is used.
MIN_CLOSING_CALL_S = 0.5


@dataclass(slots=True, kw_only=True)
class RunClock:
    """Time left before the task's absolute deadline (epoch seconds).

    Steps leave ``reserve_s`` untouched, so a step cut by the deadline still
    leaves time for the closing answer; the closing call may use all that is left.
    """

    deadline_epoch: float
    reserve_s: float
    clock: Callable[[], float] = time.time

    def remaining(self) -> float:
        return self.deadline_epoch - self.clock()

    def step_timeout(self, cap_s: float) -> float:
        """A step's model or tool call: the time left minus the reserve, capped by its default."""
        return max(0.0, min(self.remaining() - self.reserve_s, cap_s))

    def closing_timeout(self, cap_s: float) -> float:
        return max(0.0, min(self.remaining(), cap_s))

    def reached_by(self, timeout_s: float, cap_s: float) -> bool:
        """Did a call given ``timeout_s`` end because of the deadline (not its own cap)?"""
        return timeout_s < cap_s and self.remaining() <= self.reserve_s + MIN_CLOSING_CALL_S


class DeadlineToolbox(ToolboxWrapper):
    """A toolbox whose every call carries the task's deadline in its CallContext.

    MCP servers receive it in the request's ``_meta`` and may stop work that would
    outlive the task; the model never sees or sets it.
    """

    def __init__(self, inner: Toolbox, deadline_epoch: Callable[[], float]) -> None:
        super().__init__(inner)
        self._deadline_epoch = deadline_epoch

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        return await self._inner.call(name, arguments, ctx.with_deadline(self._deadline_epoch()))
