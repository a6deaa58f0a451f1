"""The state of a run, changed only by journal entries.

Every change the loop makes (a model answer, a tool result, a steering
message) is an entry appended to a journal and then applied. Replaying the
entries of a checkpoint rebuilds the same state, so a task resumed after a
crash neither re-asks the model for a step it has nor re-runs a tool call
that already ran. Their JSON form, for checkpoints in Redis, is in ``_entry_json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from worker.models import Message, ModelResponse, StopReason, ToolCall, Usage


class ToolOutcome(StrEnum):
    """How one tool call ended.

    The value is the ``outcome`` of the ``tool_call`` log line and the label of
    ``agent_tool_calls_total``: an operator's dashboards depend on it.
    """

    OK = "ok"
    ERROR = "error"  # the tool raised or answered with an error
    TIMEOUT = "timeout"
    UNKNOWN_TOOL = "unknown_tool"  # no tool of that name (the model made it up)
    MISSING_GRANT = "missing_grant"  # the agent lacks the tool's grant
    NOT_ALLOWED = "not_allowed"  # the task's allowed_tools leave it out
    INVALID_ARGUMENTS = "invalid_arguments"  # not JSON, or not valid for the input schema
    REFUSED = "refused"  # the operator's check, a write cap (or a CLI itself) refused to run it
    DEADLINE = "deadline"  # never run: the task's deadline came first

    @property
    def is_error(self) -> bool:
        """The model reads the result as an error."""
        return self is not ToolOutcome.OK

    @property
    def denied(self) -> bool:
        """Refused for who is calling (grants, allowed_tools): strict grants end the task."""
        return self in (ToolOutcome.MISSING_GRANT, ToolOutcome.NOT_ALLOWED)


@dataclass(slots=True, kw_only=True)
class ToolCallRecord:
    call_id: str
    name: str
    arguments: str
    server: str
    outcome: ToolOutcome
    is_error: bool
    content: str
    duration_s: float = 0.0


@dataclass(slots=True, kw_only=True)
class StepRecord:
    index: int
    text: str
    stop_reason: StopReason
    provider: str
    model: str
    usage: Usage
    requested_calls: tuple[ToolCall, ...] = ()
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    final: bool = False

    @property
    def truncated(self) -> bool:
        return self.stop_reason is StopReason.MAX_TOKENS

    @property
    def pending_calls(self) -> list[ToolCall]:
        """Calls the model asked for whose result is not recorded yet."""
        done = {record.call_id for record in self.tool_calls}
        return [call for call in self.requested_calls if call.id not in done]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "text": self.text,
            "stop_reason": self.stop_reason.value,
            "truncated": self.truncated,
            "model": self.model,
            "final": self.final,
            "tokens_input": self.usage.input_tokens,
            "tokens_output": self.usage.output_tokens,
            "tokens_cache_read": self.usage.cache_read_tokens,
            "tokens_cache_write": self.usage.cache_write_tokens,
            "tool_calls": [
                {"name": r.name, "outcome": r.outcome, "is_error": r.is_error}
                for r in self.tool_calls
            ],
        }


@dataclass(slots=True, kw_only=True, frozen=True)
class ResponseEntry:
    step: int
    response: ModelResponse
    final: bool = False


@dataclass(slots=True, kw_only=True, frozen=True)
class ToolEntry:
    step: int
    record: ToolCallRecord


@dataclass(slots=True, kw_only=True, frozen=True)
class SteerEntry:
    text: str


JournalEntry = ResponseEntry | ToolEntry | SteerEntry


class Journal(Protocol):
    """Where entries go as they happen (a Redis list for crash recovery; a list by default)."""

    def append(self, entry: JournalEntry) -> None: ...


class MemoryJournal:
    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def append(self, entry: JournalEntry) -> None:
        self.entries.append(entry)


@dataclass(slots=True, kw_only=True)
class LoopState:
    messages: list[Message]
    steps: list[StepRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    llm_calls: int = 0
    tool_calls: int = 0
    # Steps that are not a closing answer; counted as entries apply (checked every step).
    iterations: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.iterations = sum(1 for step in self.steps if not step.final)

    def apply(self, entry: JournalEntry) -> None:
        if isinstance(entry, ResponseEntry):
            self._apply_response(entry)
        elif isinstance(entry, ToolEntry):
            self._apply_tool(entry)
        else:
            self.messages.append(Message(role="user", content=entry.text))

    def _apply_response(self, entry: ResponseEntry) -> None:
        response = entry.response
        self.llm_calls += 1
        self.usage.add(response.usage)
        if not entry.final:
            self.iterations += 1
        self.steps.append(
            StepRecord(
                index=entry.step,
                text=response.text,
                stop_reason=response.stop_reason,
                provider=response.provider,
                model=response.model,
                usage=response.usage,
                requested_calls=response.tool_calls,
                final=entry.final,
            )
        )
        self.messages.append(
            Message(role="assistant", content=response.text, tool_calls=response.tool_calls)
        )

    def _apply_tool(self, entry: ToolEntry) -> None:
        record = entry.record
        self.tool_calls += 1
        self.steps[-1].tool_calls.append(record)
        self.messages.append(
            Message(
                role="tool",
                content=record.content,
                tool_call_id=record.call_id,
                is_error=record.is_error,
            )
        )
