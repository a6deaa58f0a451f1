"""Step checkpoints in Redis: the loop's journal, append-only, one list per task.

A step costs one RPUSH however long the task has run. A task re-run after a
crash or a requeue replays the list and goes on from where it stopped; the
list is deleted when the task ends for good.

Beside the list, a hash of tool-call intents: before a tool runs, its intent
(step, position, tool, a digest of its arguments, its idempotency key) is
recorded, so a re-run that finds an intent without a result knows the call may
have had its effect and repeats it with the same key (the Hub replays it):
``IntentJournalingToolbox`` records them, ``journal_tool_intents`` wraps a task's toolbox
opener with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.logs import log_event
from worker.loop import JournalEntry, SteerEntry, entry_from_json, entry_to_json
from worker.redis_io import keys as redis_keys
from worker.tools import (
    CallContext,
    KeyedCallContext,
    Toolbox,
    ToolboxWrapper,
    ToolResult,
    arguments_digest,
)

if TYPE_CHECKING:
    from redis import Redis

# Long enough to cover every requeue delay; a finished task deletes its list at once.
CHECKPOINT_TTL_S = 3 * 24 * 3600


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolIntent:
    """A tool call about to run: written before the call, kept until the task ends."""

    step: int
    index: int
    tool: str
    arguments_digest: str
    idempotency_key: str

    @property
    def field(self) -> str:
        return _intent_field(self.step, self.index)

    def to_json(self) -> str:
        return json.dumps(
            {
                "tool": self.tool,
                "arguments": self.arguments_digest,
                "key": self.idempotency_key,
            },
            separators=(",", ":"),
        )


def _intent_field(step: int, index: int) -> str:
    """The call's field in the task's intents hash."""
    return f"{step}:{index}"


class RedisJournal:
    def __init__(self, redis: Redis, task_id: str, *, ttl_s: int = CHECKPOINT_TTL_S) -> None:
        self._redis = redis
        self._key = redis_keys.checkpoint(task_id)
        self._intents_key = self._key + ":intents"
        self._ttl_s = ttl_s
        self._task_id = task_id

    def append(self, entry: JournalEntry) -> None:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.rpush(self._key, entry_to_json(entry))
            pipe.expire(self._key, self._ttl_s)
            pipe.execute()

    def load(self) -> list[JournalEntry]:
        """The entries so far; a corrupt tail is cut off and logged, never fatal.

        A step's record twice in a row is one record: the RPUSH that Redis ran just before
        it stopped, sent again by the connection's retry (a model answer and a tool result
        name their step and are each recorded once; only steering may repeat).
        """
        entries: list[JournalEntry] = []
        previous = None
        for position, raw in enumerate(self._redis.lrange(self._key, 0, -1)):
            try:
                entry = entry_from_json(raw)
            except (ValueError, KeyError, TypeError) as exc:
                log_event(
                    "checkpoint_corrupt",
                    "warning",
                    task=self._task_id,
                    position=position,
                    error=str(exc),
                )
                break
            if raw != previous or isinstance(entry, SteerEntry):
                entries.append(entry)
            previous = raw
        return entries

    def record_intent(self, intent: ToolIntent) -> None:
        """Write the intent before the call: it must be in Redis before any side effect."""
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._intents_key, intent.field, intent.to_json())
            pipe.expire(self._intents_key, self._ttl_s)
            pipe.execute()

    def intent(self, step: int, index: int) -> ToolIntent | None:
        """The intent recorded for that call by an earlier run, if any (None if unreadable)."""
        raw = self._redis.hget(self._intents_key, _intent_field(step, index))
        if raw is None:
            return None
        try:
            body = json.loads(raw)
            return ToolIntent(
                step=step,
                index=index,
                tool=str(body["tool"]),
                arguments_digest=str(body["arguments"]),
                idempotency_key=str(body["key"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def clear(self) -> None:
        self._redis.delete(self._key, self._intents_key)


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


ToolboxOpener = Callable[[Any, Any, Any], AbstractAsyncContextManager[Toolbox]]


def journal_tool_intents(open_toolbox: ToolboxOpener, redis: Redis) -> ToolboxOpener:
    """Wrap a task runtime's toolbox opener so every call journals its intent first."""

    @asynccontextmanager
    async def open_journaling(agent: Any, task: Any, scope: Any) -> AsyncIterator[Toolbox]:
        async with open_toolbox(agent, task, scope) as toolbox:
            yield IntentJournalingToolbox(toolbox, RedisJournal(redis, task.task_id))

    return open_journaling
