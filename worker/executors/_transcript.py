"""What a CLI run produced, turned into the same RunResult (and events) as the native loop.

A CLI reports its turns, its final text and its usage; the gateway reports the tool
calls it ran. ``run_result`` joins both into a ``LoopState``: one step per CLI turn,
each tool call on the turn that asked for it. Where the CLI does not say which turn
made which call (claude-code's JSON result only counts turns), calls go in order, one
per turn that was followed by another (or cut short by a limit), and any surplus
(parallel calls) stays on the last turn that made calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from worker.exceptions import WorkerError
from worker.executors._call_log import GatewayActivity
from worker.loop import (
    EventBus,
    GrantDenied,
    Limit,
    LlmCalled,
    LoopState,
    RunResult,
    StepFinished,
    StepRecord,
    StepStarted,
    ToolCalled,
    ToolCallRecord,
)
from worker.models import Message, StopReason, ToolCall, Usage
from worker.task import Outcome


@dataclass(slots=True, kw_only=True)
class CliTurn:
    """One model turn of the CLI's own loop, as far as the CLI reports it."""

    text: str = ""
    usage: Usage | None = None
    # Tool calls the turn asked for, when the CLI itemises them.
    tool_requests: int | None = None


@dataclass(slots=True, kw_only=True)
class CliTranscript:
    """A CLI's answer, parsed. ``error`` set means the run failed (the CLI said why)."""

    output: str
    turns: list[CliTurn] = field(default_factory=list)
    # Totals for the run; ``cost_usd`` None when the CLI does not report one.
    usage: Usage = field(default_factory=lambda: Usage(cost_usd=None))
    outcome: Outcome = Outcome.COMPLETED
    detail: str = ""
    error: WorkerError | None = None
    # Calls the CLI refused itself, before they reached the gateway.
    refused_calls: list[ToolCallRecord] = field(default_factory=list)

    def fail(self, error: WorkerError) -> CliTranscript:
        """Mark the run failed with ``error``: no answer, the outcome its class calls for."""
        self.error = error
        self.outcome = Outcome.of_error(error)
        self.detail = error.message
        self.output = ""
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """Who ran and where the result goes."""

    executor: str
    task_id: str
    agent_id: str
    provider: str
    model: str
    messages: Sequence[Message]
    events: EventBus
    # The agent's grants are strict: a refused call ended the run.
    strict_grants: bool = False


def run_result(
    context: RunContext,
    transcript: CliTranscript,
    activity: GatewayActivity,
    *,
    duration_s: float,
) -> RunResult:
    """The RunResult of a CLI run; its steps, calls and denials are emitted as loop events."""
    calls = [*activity.calls, *transcript.refused_calls]
    turns = transcript.turns
    if not turns and (transcript.output or calls):
        turns = [CliTurn(text=transcript.output)]
    per_turn = _calls_per_turn(
        calls, turns, last_turn_answered=transcript.outcome is Outcome.COMPLETED
    )
    usage_known = any(turn.usage is not None for turn in turns)
    steps = []
    for index, (turn, turn_calls) in enumerate(zip(turns, per_turn, strict=True), start=1):
        last = index == len(turns)
        usage = turn.usage or (transcript.usage if last and not usage_known else Usage())
        steps.append(
            StepRecord(
                index=index,
                text=turn.text,
                stop_reason=StopReason.TOOL_USE if turn_calls else StopReason.END_TURN,
                provider=context.provider,
                model=context.model,
                usage=usage,
                requested_calls=tuple(
                    ToolCall(id=call.call_id, name=call.name, arguments=call.arguments)
                    for call in turn_calls
                ),
                tool_calls=list(turn_calls),
            )
        )
    output, fallback = transcript.output, False
    limit = Limit.of(transcript.outcome)
    if limit is not None and not output.strip():
        output, fallback = limit.fallback_answer, True
    state = LoopState(
        messages=[*context.messages, Message(role="assistant", content=output)],
        steps=steps,
        usage=transcript.usage,
        llm_calls=len(steps),
        tool_calls=len(calls),
    )
    _emit(context, state, activity)
    return RunResult(
        outcome=transcript.outcome,
        output=output,
        state=state,
        duration_s=duration_s,
        detail=transcript.detail,
        error=transcript.error,
        fallback=fallback,
    )


def _calls_per_turn(
    calls: Sequence[ToolCallRecord], turns: Sequence[CliTurn], *, last_turn_answered: bool
) -> list[list[ToolCallRecord]]:
    buckets: list[list[ToolCallRecord]] = [[] for _ in turns]
    queue = deque(calls)
    for index, turn in enumerate(turns):
        wanted = turn.tool_requests
        if wanted is None:
            # Unknown: a turn followed by another one made at least one call; so did the
            # last one, when a limit (not an answer) ended the run.
            wanted = 1 if index < len(turns) - 1 or not last_turn_answered else 0
        for _ in range(wanted):
            if not queue:
                break
            buckets[index].append(queue.popleft())
    if queue:
        target = max((index for index, bucket in enumerate(buckets) if bucket), default=0)
        buckets[target].extend(queue)
    return buckets


def _emit(context: RunContext, state: LoopState, activity: GatewayActivity) -> None:
    """Tell the observers (metrics, the log) what the CLI did, after the fact."""
    events = context.events
    for step in state.steps:
        events.emit(StepStarted(step=step.index))
        events.emit(
            LlmCalled(
                step=step.index,
                provider=context.provider,
                model=context.model,
                status="ok",
                usage=step.usage,
                duration_s=0.0,
                stop_reason=step.stop_reason,
            )
        )
        for call in step.tool_calls:
            events.emit(
                ToolCalled(
                    step=step.index,
                    tool=call.name,
                    server=call.server,
                    outcome=call.outcome,
                    duration_s=call.duration_s,
                )
            )
        if step.tool_calls:
            failed = sum(1 for call in step.tool_calls if call.is_error)
            events.emit(
                StepFinished(
                    step=step.index, tool_calls=len(step.tool_calls), failed_tool_calls=failed
                )
            )
    for denial in activity.denials:
        # No grant named: the task's allowed_tools left the tool out.
        reason = "missing_grant" if denial.required_grant else "not_allowed"
        events.emit(
            GrantDenied(
                step=denial.step,
                tool=denial.tool,
                required_grant=denial.required_grant,
                reason=reason,
                strict=context.strict_grants,
            )
        )
