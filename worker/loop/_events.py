"""Observable steps of a run. Observers get every event; one that raises is logged and ignored.

``log_observer`` writes the per-call log lines (``llm_call``, ``tool_call``,
``grant_denied``) from these events: the native loop, a CLI executor's transcript and the
gateway all attach it, so the lines are written in one place, alike for every run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from worker.logs import enabled as log_enabled
from worker.logs import log_event
from worker.models import StopReason, Usage


@dataclass(slots=True, kw_only=True, frozen=True)
class StepStarted:
    step: int


@dataclass(slots=True, kw_only=True, frozen=True)
class LlmCalled:
    step: int
    provider: str
    model: str
    status: str  # "ok" or the error code
    usage: Usage
    duration_s: float
    stop_reason: StopReason | None
    final: bool = False  # the closing, tool-less call after a limit


@dataclass(slots=True, kw_only=True, frozen=True)
class ToolCalled:
    step: int
    tool: str
    server: str
    # ok | error | timeout | unknown_tool | missing_grant | not_allowed | invalid_arguments
    # | refused
    outcome: str
    duration_s: float
    # False when the name is no tool the configuration knows (the model made it up):
    # metrics then count it under one label instead of one series per invented name.
    known: bool = True


@dataclass(slots=True, kw_only=True, frozen=True)
class GrantDenied:
    """A call refused before it ran: the agent lacks the grant, or the task does not allow it."""

    step: int
    tool: str
    required_grant: str  # "" when the task's allowed_tools left the tool out
    reason: str = "missing_grant"  # or "not_allowed"
    strict: bool = False  # the agent's grants are strict: the refusal ends the run


@dataclass(slots=True, kw_only=True, frozen=True)
class StepFinished:
    step: int
    tool_calls: int
    failed_tool_calls: int


LoopEvent = StepStarted | LlmCalled | ToolCalled | GrantDenied | StepFinished


class LoopObserver(Protocol):
    def __call__(self, event: LoopEvent) -> None: ...


_O = TypeVar("_O", bound=LoopObserver)


def observing(*event_types: type[LoopEvent]) -> Callable[[_O], _O]:
    """Marks an observer that acts only on ``event_types``: the bus sends it no other
    event, and builds no event that no observer acts on. Unmarked observers get all."""

    def mark(observer: _O) -> _O:
        observer.loop_events = frozenset(event_types)  # type: ignore[attr-defined]
        return observer

    return mark


class EventBus:
    """Fans events out to observers; an observer's exception never reaches the loop."""

    def __init__(self, observers: Sequence[LoopObserver] = ()) -> None:
        self._observers = list(observers)
        # Per event type: the observers that act on it (from their `observing` marks).
        self._by_type: dict[type[LoopEvent], list[LoopObserver]] = {}

    def add(self, observer: LoopObserver) -> None:
        self._observers.append(observer)
        self._by_type.clear()

    def wants(self, event_type: type[LoopEvent]) -> bool:
        """Whether any observer acts on ``event_type`` (else the event need not be built)."""
        return bool(self._observing(event_type))

    def emit(self, event: LoopEvent) -> None:
        for observer in self._observing(type(event)):
            try:
                observer(event)
            except Exception as exc:
                log_event(
                    "observer_failed",
                    "warning",
                    observer=getattr(observer, "__qualname__", type(observer).__name__),
                    event_type=type(event).__name__,
                    error=f"{type(exc).__name__}: {exc}",
                )

    def _observing(self, event_type: type[LoopEvent]) -> list[LoopObserver]:
        found = self._by_type.get(event_type)
        if found is None:
            found = self._by_type[event_type] = [
                observer
                for observer in self._observers
                if event_type in getattr(observer, "loop_events", (event_type,))
            ]
        return found


def log_observer(*, task_id: str, agent_id: str, executor: str | None = None) -> LoopObserver:
    """The observer that logs each model call, tool call and refused call of one run.

    ``executor`` names a CLI executor whose transcript the events come from (the native
    loop leaves it out).
    """
    who: dict[str, Any] = {"task": task_id, "agent": agent_id}
    if executor is not None:
        who["executor"] = executor

    @observing(LlmCalled, ToolCalled, GrantDenied)
    def observe(event: LoopEvent) -> None:
        # With logs off (or above info) the line's fields are not even built.
        if not log_enabled("warning" if isinstance(event, GrantDenied) else "info"):
            return
        if isinstance(event, LlmCalled):
            log_event(
                "llm_call",
                **who,
                step=event.step,
                provider=event.provider,
                model=event.model,
                status=event.status,
                tokens_input=event.usage.input_tokens,
                tokens_output=event.usage.output_tokens,
                tokens_cache_read=event.usage.cache_read_tokens,
                tokens_cache_write=event.usage.cache_write_tokens,
                stop_reason=event.stop_reason.value if event.stop_reason else None,
                duration_ms=round(event.duration_s * 1000, 2),
            )
        elif isinstance(event, ToolCalled):
            log_event(
                "tool_call",
                **who,
                step=event.step,
                tool=event.tool,
                server=event.server,
                outcome=event.outcome,
                duration_ms=round(event.duration_s * 1000, 2),
            )
        elif isinstance(event, GrantDenied):
            log_event(
                "grant_denied",
                "warning",
                **who,
                tool=event.tool,
                required_grant=event.required_grant or None,
                reason=event.reason,
                strict=event.strict,
            )

    return observe
