"""The JSON form of journal entries, for checkpoints.

Each entry is one JSON object with named fields, its ``kind`` and a ``version``::

    {"kind": "model_response", "version": 2, "step": 1, "final": false, "text": "...",
     "tool_calls": [{"id": "c1", "name": "hub__search_posts", "arguments": "{}"}],
     "stop_reason": "tool_use", "provider": "openai", "model": "gpt-4o-mini",
     "usage": {"input_tokens": 50, "output_tokens": 5, "cost_usd": 0.0001}}
    {"kind": "tool_result", "version": 2, "step": 1, "record": {"call_id": "c1", ...}}
    {"kind": "user_message", "version": 2, "text": "..."}

Version 1 (no ``version``; kinds ``response``, ``tool``, ``steer``) kept calls, usage
and tool records as positional arrays. A task in flight during an upgrade resumes
from such a checkpoint, so reading still accepts it; nothing writes it any more.
The kinds were renamed with the version so that a worker not yet upgraded, reading
a newer record, stops there (a corrupt tail, logged) instead of misreading its
objects as arrays.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, Field, TypeAdapter

from worker.loop._state import (
    JournalEntry,
    ResponseEntry,
    SteerEntry,
    ToolCallRecord,
    ToolEntry,
    ToolOutcome,
)
from worker.models import ModelResponse, StopReason, ToolCall, Usage

RECORD_VERSION: Final = 2


class _ResponseRecord(BaseModel):
    kind: Literal["model_response"] = "model_response"
    version: Literal[2] = RECORD_VERSION
    step: int
    final: bool
    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: StopReason
    usage: Usage
    provider: str
    model: str

    def entry(self) -> ResponseEntry:
        response = ModelResponse(
            text=self.text,
            tool_calls=self.tool_calls,
            stop_reason=self.stop_reason,
            usage=self.usage,
            provider=self.provider,
            model=self.model,
        )
        return ResponseEntry(step=self.step, final=self.final, response=response)


class _ToolRecord(BaseModel):
    kind: Literal["tool_result"] = "tool_result"
    version: Literal[2] = RECORD_VERSION
    step: int
    record: ToolCallRecord

    def entry(self) -> ToolEntry:
        return ToolEntry(step=self.step, record=self.record)


class _SteerRecord(BaseModel):
    kind: Literal["user_message"] = "user_message"
    version: Literal[2] = RECORD_VERSION
    text: str

    def entry(self) -> SteerEntry:
        return SteerEntry(text=self.text)


_Record = Annotated[_ResponseRecord | _ToolRecord | _SteerRecord, Field(discriminator="kind")]
_RECORD: TypeAdapter[_Record] = TypeAdapter(_Record)


def entry_to_json(entry: JournalEntry) -> str:
    """The entry as one checkpoint record (the current version)."""
    record: _Record
    if isinstance(entry, ResponseEntry):
        response = entry.response
        record = _ResponseRecord(
            step=entry.step,
            final=entry.final,
            text=response.text,
            tool_calls=response.tool_calls,
            stop_reason=response.stop_reason,
            usage=response.usage,
            provider=response.provider,
            model=response.model,
        )
    elif isinstance(entry, ToolEntry):
        record = _ToolRecord(step=entry.step, record=entry.record)
    else:
        record = _SteerRecord(text=entry.text)
    return record.model_dump_json()


def entry_from_json(raw: str | bytes) -> JournalEntry:
    """The entry a checkpoint record holds, of either version.

    Raises ValueError, KeyError or TypeError for a record that is no entry at all.
    """
    body = json.loads(raw)
    if isinstance(body, dict) and "version" not in body:
        return _entry_from_version_1(body)
    return _RECORD.validate_python(body).entry()


def _entry_from_version_1(body: dict[str, Any]) -> JournalEntry:
    """A record as written before named fields: calls, usage and tool records as arrays."""
    kind = body["kind"]
    if kind == "response":
        tokens_in, tokens_out, cost = body["usage"]
        return ResponseEntry(
            step=body["step"],
            final=body["final"],
            response=ModelResponse(
                text=body["text"],
                tool_calls=tuple(
                    ToolCall(id=i, name=n, arguments=a) for i, n, a in body["tool_calls"]
                ),
                stop_reason=StopReason(body["stop_reason"]),
                usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost),
                provider=body["provider"],
                model=body["model"],
            ),
        )
    if kind == "tool":
        call_id, name, arguments, server, outcome, is_error, content, duration = body["record"]
        record = ToolCallRecord(
            call_id=call_id,
            name=name,
            arguments=arguments,
            server=server,
            outcome=ToolOutcome(outcome),
            is_error=is_error,
            content=content,
            duration_s=duration,
        )
        return ToolEntry(step=body["step"], record=record)
    if kind == "steer":
        return SteerEntry(text=body["text"])
    raise ValueError(f"unknown checkpoint entry kind {kind!r}")
