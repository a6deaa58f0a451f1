"""Idempotency keys of tool calls across crashes and re-runs.

Two toolbox wrappers, one per way a task runs:

- ``IntentJournalingToolbox`` (native loop): before each call it records the
  call's intent in the task's Redis journal. A re-run resumed from the
  checkpoint that finds an intent without a result (the process died between
  the call and its checkpoint) repeats the call with the recorded key, so the
  Hub replays the first answer instead of writing twice.
- ``ContentKeyedToolbox`` (CLI executors, through ``mcp_servers.gateway``): a
  CLI cannot resume, it runs the task again from the start, so a key made of
  the call's position (``<task>:tool:<n>:1``) would name a *different* write the
  second time and the Hub would answer it with the first run's result. Keys
  are made of what the call does instead: ``<task>:tool:<digest>:<k>`` for the
  k-th call of that tool with those arguments. The same write in a re-run
  replays; a different write is a new key.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from worker.coordination import RedisJournal, ToolIntent, arguments_digest
from worker.logs import log_event
from worker.tools._base import CallContext, Toolbox, ToolboxWrapper, ToolResult

# The CLI gateway imports this module at every start and never touches Redis through it.
if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    "ContentKeyedToolbox",
    "IntentJournalingToolbox",
    "KeyedCallContext",
    "content_key",
    "journal_tool_intents",
]

# Hex digits of the arguments digest in a content key: keys stay short, collisions nil.
_CONTENT_KEY_DIGITS = 16


@dataclasses.dataclass(slots=True, kw_only=True, frozen=True)
class KeyedCallContext(CallContext):
    """A CallContext whose idempotency key was decided elsewhere (journal, content)."""

    key: str

    @property
    def idempotency_key(self) -> str:
        return self.key

    @classmethod
    def of(cls, ctx: CallContext, key: str) -> KeyedCallContext:
        values = {field.name: getattr(ctx, field.name) for field in dataclasses.fields(ctx)}
        values.pop("key", None)
        return cls(**values, key=key)


def content_key(task_id: str, tool: str, arguments: dict[str, Any], occurrence: int) -> str:
    """``<task_id>:tool:<digest of tool and arguments>:<occurrence>`` (occurrence from 1)."""
    digest = arguments_digest(tool, arguments)[:_CONTENT_KEY_DIGITS]
    return f"{task_id}:tool:{digest}:{occurrence}"


class IntentJournalingToolbox(ToolboxWrapper):
    """Records each call's intent in the task's journal before the call runs."""

    def __init__(self, toolbox: Toolbox, journal: RedisJournal) -> None:
        super().__init__(toolbox)
        self._journal = journal

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        digest = arguments_digest(name, arguments)
        recorded = self._journal.intent(ctx.step, ctx.index)
        if recorded is not None and recorded.tool == name and recorded.arguments_digest == digest:
            # An earlier run recorded this call and died before its result was checkpointed:
            # it may have had its effect. The same key makes the Hub replay, not write again.
            log_event(
                "tool_call_in_doubt",
                "warning",
                task=ctx.task_id,
                step=ctx.step,
                index=ctx.index,
                tool=name,
            )
            ctx = KeyedCallContext.of(ctx, recorded.idempotency_key)
        else:
            self._journal.record_intent(
                ToolIntent(
                    step=ctx.step,
                    index=ctx.index,
                    tool=name,
                    arguments_digest=digest,
                    idempotency_key=ctx.idempotency_key,
                )
            )
        return await self._inner.call(name, arguments, ctx)


class ContentKeyedToolbox(ToolboxWrapper):
    """Keys each call by what it does (tool, arguments, how often so far), not by position."""

    def __init__(self, toolbox: Toolbox) -> None:
        super().__init__(toolbox)
        self._seen: Counter[str] = Counter()

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        digest = arguments_digest(name, arguments)
        self._seen[digest] += 1
        key = content_key(ctx.task_id, name, arguments, self._seen[digest])
        return await self._inner.call(name, arguments, KeyedCallContext.of(ctx, key))


ToolboxOpener = Callable[[Any, Any, Any], AbstractAsyncContextManager[Toolbox]]


def journal_tool_intents(open_toolbox: ToolboxOpener, redis: Redis) -> ToolboxOpener:
    """Wrap a task runtime's toolbox opener so every call journals its intent first."""

    @asynccontextmanager
    async def open_journaling(agent: Any, task: Any, scope: Any) -> AsyncIterator[Toolbox]:
        async with open_toolbox(agent, task, scope) as toolbox:
            yield IntentJournalingToolbox(toolbox, RedisJournal(redis, task.task_id))

    return open_journaling
