"""What a run is given (LoopSettings, a ControlSource) and what it gives back (RunResult)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.loop._limits import Limit, RunLimits
from worker.loop._output import recover_output
from worker.loop._state import JournalEntry, LoopState, StepRecord, ToolCallRecord
from worker.models import Message, ModelPrice
from worker.task import Outcome


@dataclass(slots=True, kw_only=True)
class Control:
    cancelled: bool = False
    steering: list[str] = field(default_factory=list)


class ControlSource(Protocol):
    """Cancel and steer requests for a running task, drained before each step."""

    async def poll(self) -> Control: ...


@dataclass(slots=True, kw_only=True, frozen=True)
class Closing:
    """Why a run asks for its answer now, in one tool-less closing turn.

    ``delivered`` is the task's answer when it already reached its reader (the reply
    posted through a tool): the run is then complete whatever the closing turn says.
    """

    reason: str
    delivered: str | None = None


class CallRules(Protocol):
    """What the task knows about its tool calls that the loop does not."""

    def read_only(self, tool: str) -> bool:
        """The tool only reads: an identical repeated call may get the earlier result."""
        ...

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        """After a call: why the run should close now (answer delivered, write refused)."""
        ...


class NoCallRules:
    """The rules of a task that knows nothing more: no tool is read-only, and only the
    limits and loop guards close a run."""

    def read_only(self, tool: str) -> bool:
        return False

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        return None


class NoControl:
    """The control source of a run nobody cancels or steers (tests, a loop run by hand)."""

    async def poll(self) -> Control:
        return Control()


NO_CONTROL: ControlSource = NoControl()


Redact = Callable[[str], str]


def as_written(text: str) -> str:
    """No redaction: for runs whose messages hold no secret (tests, the loop on its own)."""
    return text


@dataclass(slots=True, kw_only=True)
class LoopSettings:
    limits: RunLimits = field(default_factory=RunLimits)
    max_same_call_repeats: int = 3
    max_consecutive_error_steps: int = 3
    require_done_tool: bool = False
    tool_output_max_chars: int = 20_000
    context_budget_chars: int = 200_000
    llm_timeout_cap_s: float = 120.0
    tool_timeout_cap_s: float = 60.0
    max_output_tokens: int | None = None
    temperature: float | None = None
    # The task's absolute deadline (epoch seconds), shared by every run of the task;
    # None: ``limits.max_duration_s`` from the start of this run.
    deadline_epoch: float | None = None
    # The price cost budgets are planned with (a fallback chain: its dearest member);
    # None: unknown, and a cost budget assumes the next call costs what the last one did.
    price: ModelPrice | None = None
    # The JSON schema every answer must follow (structured output, sent with each call);
    # None: free text.
    response_schema: dict[str, Any] | None = None
    response_schema_name: str = "answer"
    # Read-only tools and closing triggers, from the task.
    call_rules: CallRules = field(default_factory=NoCallRules)
    # The model's context window (prompt and answer, in tokens); None: unbounded. Older
    # tool outputs, then the middle of the longest message, are cut to fit it.
    context_window_tokens: int | None = None
    # Masks known secrets in a message the window fit is about to cut (redact, then cut:
    # half a secret is no longer recognisable at the model boundary).
    redact: Redact = as_written


@dataclass(slots=True, kw_only=True)
class RunResult:
    """Everything a run produced, also when it stopped early or failed."""

    outcome: Outcome
    output: str
    state: LoopState
    duration_s: float
    detail: str = ""
    error: BaseException | None = None
    # True when ``output`` is the fixed fallback text, not something the model wrote.
    fallback: bool = False

    @property
    def messages(self) -> list[Message]:
        return self.state.messages

    @property
    def steps(self) -> list[StepRecord]:
        return self.state.steps


def expired_result(resume: Sequence[JournalEntry], *, detail: str) -> RunResult:
    """The result of a task whose deadline passed before this run could start.

    What earlier runs did (replayed from the checkpoint) is kept, so the report still
    counts their calls and tokens; nothing is called.
    """
    state = LoopState(messages=[])
    for entry in resume:
        state.apply(entry)
    output = recover_output(state.steps, "")
    return RunResult(
        outcome=Outcome.DEADLINE,
        output=output or Limit.DEADLINE.fallback_answer,
        fallback=not output,
        state=state,
        duration_s=0.0,
        detail=detail,
    )
