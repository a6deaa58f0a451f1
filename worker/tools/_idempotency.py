"""Idempotency keys of tool calls across crashes and re-runs.

Two toolbox wrappers, one per way a task runs:

- ``IntentJournalingToolbox`` (native loop, in ``worker.coordination`` beside the journal
  it writes): before each call it records the call's intent in the task's Redis
  journal. A re-run resumed from the checkpoint that finds an intent without a result
  (the process died between the call and its checkpoint) repeats the call with the
  recorded key, so the Hub replays the first answer instead of writing twice.
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
import hashlib
import json
from collections import Counter
from typing import Any

from worker.tools._base import CallContext, Toolbox, ToolboxWrapper, ToolResult

__all__ = ["ContentKeyedToolbox", "KeyedCallContext", "arguments_digest", "content_key"]

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


def arguments_digest(tool: str, arguments: dict[str, Any]) -> str:
    """A stable digest of a call (tool and canonical JSON arguments)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{tool}\n{canonical}".encode()).hexdigest()[:32]


def content_key(task_id: str, tool: str, arguments: dict[str, Any], occurrence: int) -> str:
    """``<task_id>:tool:<digest of tool and arguments>:<occurrence>`` (occurrence from 1)."""
    digest = arguments_digest(tool, arguments)[:_CONTENT_KEY_DIGITS]
    return f"{task_id}:tool:{digest}:{occurrence}"


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
