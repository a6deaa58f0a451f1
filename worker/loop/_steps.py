"""What the loop does next: the typed value each step returns and the loop dispatches on.

AskModel     check the limits, budget the call, ask the model
RunTools     run the tool calls the model made
Nudge        append a user message, then ask again (the done tool was not called)
WindDown     a limit was reached: one last tool-less call for a final answer
Close        the answer was delivered, a write was refused or a loop guard tripped:
             one tool-less closing call, whose answer completes the run
FinalAnswer  the model answered: the run is complete
Stop         the run ends with an outcome
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from worker.exceptions import WorkerError
from worker.loop._contract import Closing
from worker.loop._dispatch import DONE_TOOL
from worker.loop._limits import Limit
from worker.models import ModelResponse, ToolCall
from worker.task import Outcome

DONE_TOOL_REMINDER = (
    "When you are finished, call the task_complete tool with your final answer. "
    "If you are not finished, continue with your tools."
)


@dataclass(slots=True, frozen=True)
class AskModel:
    pass


@dataclass(slots=True, frozen=True)
class RunTools:
    calls: tuple[ToolCall, ...]


@dataclass(slots=True, frozen=True)
class Nudge:
    text: str


@dataclass(slots=True, frozen=True)
class WindDown:
    limit: Limit
    detail: str


@dataclass(slots=True, frozen=True)
class Close:
    closing: Closing
    # The outcome when the closing call gives no answer (and none was delivered).
    silent_outcome: Outcome = Outcome.COMPLETED


@dataclass(slots=True, frozen=True)
class FinalAnswer:
    text: str


@dataclass(slots=True, frozen=True)
class Stop:
    outcome: Outcome
    detail: str
    output: str = ""
    # True when ``output`` is the fixed fallback text, not something the model wrote.
    fallback: bool = False
    error: BaseException | None = None

    @classmethod
    def for_error(cls, error: Exception) -> Stop:
        """The run raised: the outcome the error's class calls for, and its message."""
        detail = (
            error.message if isinstance(error, WorkerError) else f"{type(error).__name__}: {error}"
        )
        return cls(Outcome.of_error(error), detail, error=error)

    @classmethod
    def at_limit(cls, limit: Limit, detail: str, answer: str) -> Stop:
        """The run stops at ``limit`` with ``answer``, or the limit's fallback text if blank."""
        if answer.strip():
            return cls(limit.outcome, detail, answer)
        return cls(limit.outcome, detail, limit.fallback_answer, fallback=True)


NextStep = AskModel | RunTools | Nudge | WindDown | Close | FinalAnswer | Stop


def decide(response: ModelResponse, *, require_done_tool: bool) -> FinalAnswer | RunTools | Nudge:
    """What a model answer asks for: tools to run, or a final answer (or a nudge to give one)."""
    if require_done_tool:
        for call in response.tool_calls:
            if call.name == DONE_TOOL.name:
                return FinalAnswer(_done_answer(call) or response.text)
        if not response.tool_calls:
            return Nudge(DONE_TOOL_REMINDER)
    if not response.tool_calls:
        return FinalAnswer(response.text)
    return RunTools(response.tool_calls)


def _done_answer(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return ""
    answer = arguments.get("answer") if isinstance(arguments, dict) else None
    return answer if isinstance(answer, str) else ""
