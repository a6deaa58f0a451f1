"""The reason → tool → observe loop.

run():   restore from the journal → until a next step says stop:
         take control messages → check limits → ask the model → decide → run tools
Limits reached: one last tool-less call for a final answer within what is left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from worker.exceptions import (
    AutonomyViolation,
    LimitReached,
    ModelError,
    ModelUnavailable,
    WorkerError,
)
from worker.logs import log_event
from worker.loop._dispatch import DONE_TOOL, CanExecuteTool, ToolDispatcher, ToolLoopGuard
from worker.loop._events import EventBus, LlmCalled, LoopObserver, StepFinished, StepStarted
from worker.loop._limits import RunLimits
from worker.loop._output import FALLBACK_ANSWER, Compactor, recover_output
from worker.loop._state import (
    Journal,
    JournalEntry,
    LoopState,
    MemoryJournal,
    ResponseEntry,
    SteerEntry,
    StepRecord,
    ToolEntry,
)
from worker.models._types import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from worker.task import Outcome
from worker.tools._base import Toolbox

WIND_DOWN_PROMPT = (
    "You have reached this task's limit ({detail}). Do not call any tool. "
    "Reply now with your final answer, based on what you already have."
)
DONE_TOOL_REMINDER = (
    "When you are finished, call the task_complete tool with your final answer. "
    "If you are not finished, continue with your tools."
)
# A closing answer under a cost budget is kept short: its output is what it may still buy.
CLOSING_ANSWER_TOKENS = 1024
_LIMIT_OUTCOMES = {
    "max_iterations": Outcome.MAX_ITERATIONS,
    "max_tokens": Outcome.MAX_TOKENS,
    "deadline": Outcome.DEADLINE,
    "budget": Outcome.BUDGET,
}


@dataclass(slots=True, kw_only=True)
class Control:
    cancelled: bool = False
    steering: list[str] = field(default_factory=list)


class ControlSource(Protocol):
    """Cancel and steer requests for a running task, drained before each step."""

    async def poll(self) -> Control: ...


@dataclass(slots=True, kw_only=True)
class LoopSettings:
    limits: RunLimits = field(default_factory=RunLimits)
    max_same_call_repeats: int = 3
    max_consecutive_error_steps: int = 3
    require_done_tool: bool = False
    strict_grants: bool = False
    tool_output_max_chars: int = 20_000
    context_budget_chars: int = 200_000
    llm_timeout_cap_s: float = 120.0
    tool_timeout_cap_s: float = 60.0
    max_output_tokens: int | None = None
    temperature: float | None = None


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


# The typed "what next" each step returns; run() only dispatches on it.
@dataclass(slots=True, frozen=True)
class FinalAnswer:
    text: str


@dataclass(slots=True, frozen=True)
class RunTools:
    calls: tuple[ToolCall, ...]


@dataclass(slots=True, frozen=True)
class Nudge:
    text: str


@dataclass(slots=True, frozen=True)
class Stop:
    outcome: Outcome
    detail: str
    output: str = ""
    fallback: bool = False


NextStep = FinalAnswer | RunTools | Nudge | Stop


class AgentLoop:
    def __init__(
        self,
        *,
        model: Model,
        toolbox: Toolbox,
        system: str,
        settings: LoopSettings,
        task_id: str,
        agent_id: str,
        observers: Sequence[LoopObserver] = (),
        control: ControlSource | None = None,
        can_execute_tool: CanExecuteTool | None = None,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._model = model
        self._toolbox = toolbox
        self._system = system
        self._settings = settings
        self._limits = settings.limits
        self._task_id = task_id
        self._agent_id = agent_id
        self.events = EventBus(observers)
        self._control = control
        self._journal: Journal = journal if journal is not None else MemoryJournal()
        self._clock = clock
        self._deadline = 0.0
        self._dispatcher = ToolDispatcher(
            toolbox,
            task_id=task_id,
            agent_id=agent_id,
            events=self.events,
            strict_grants=settings.strict_grants,
            max_output_chars=settings.tool_output_max_chars,
            can_execute_tool=can_execute_tool,
        )
        self._guard = ToolLoopGuard(
            max_same_call_repeats=settings.max_same_call_repeats,
            max_consecutive_error_steps=settings.max_consecutive_error_steps,
        )
        self._compactor = Compactor(settings.context_budget_chars)

    # --- the run -----------------------------------------------------------------------------

    async def run(
        self, messages: Sequence[Message], *, resume: Sequence[JournalEntry] = ()
    ) -> RunResult:
        """Run to an outcome. ``resume`` replays a checkpoint's entries before going on."""
        started = self._clock()
        self._deadline = started + self._limits.max_duration_s
        state = LoopState(messages=list(messages))
        for entry in resume:
            self._apply(state, entry)
        self._guard.replay(state.steps)
        error: BaseException | None = None
        try:
            # Backstop only: every call already has the remaining time as its timeout.
            with anyio.fail_after(self._limits.max_duration_s + 5):
                stop = await self._run_steps(state)
        except TimeoutError:
            stop = Stop(Outcome.DEADLINE, "the task's wall-clock budget ran out mid-call")
        except AutonomyViolation as exc:
            stop, error = Stop(Outcome.AUTONOMY_VIOLATION, exc.message), exc
        except ModelError as exc:
            stop, error = Stop(Outcome.MODEL_ERROR, exc.message), exc
        except WorkerError as exc:
            stop, error = Stop(Outcome.ERROR, exc.message), exc
        except Exception as exc:
            stop, error = Stop(Outcome.ERROR, f"{type(exc).__name__}: {exc}"), exc
        output = stop.output or recover_output(state.steps, "")
        fallback = stop.fallback
        if stop.outcome is Outcome.DEADLINE and not output:
            output, fallback = FALLBACK_ANSWER.format(limit="deadline"), True
        return RunResult(
            outcome=stop.outcome,
            output=output,
            fallback=fallback,
            state=state,
            duration_s=self._clock() - started,
            detail=stop.detail,
            error=error,
        )

    async def _run_steps(self, state: LoopState) -> Stop:
        pending = state.steps[-1].pending_calls if state.steps else []
        if pending:  # resumed mid-step: finish the calls that had not run
            stop = await self._run_tools(state, tuple(pending))
            if stop is not None:
                return stop
        elif state.steps and not state.steps[-1].requested_calls:
            return self._finish(state, state.steps[-1].text)  # resumed after the answer
        while True:
            stop = await self._take_control(state)
            if stop is not None:
                return stop
            try:
                self._check_limits(state)
            except LimitReached as limit:
                return await self._wind_down(state, limit)
            step = len(state.steps) + 1
            self.events.emit(StepStarted(step=step))
            response = await self._ask(state, self._offered_tools(), step=step)
            self._commit(state, ResponseEntry(step=step, response=response))
            next_step = self._decide(response)
            if isinstance(next_step, FinalAnswer):
                return self._finish(state, next_step.text)
            if isinstance(next_step, Nudge):
                self._commit(state, SteerEntry(text=next_step.text))
            elif isinstance(next_step, RunTools):
                stop = await self._run_tools(state, next_step.calls)
                if stop is not None:
                    return stop
            else:
                raise TypeError(f"unknown next step {next_step!r}")

    # --- steps -------------------------------------------------------------------------------

    async def _take_control(self, state: LoopState) -> Stop | None:
        if self._control is None:
            return None
        control = await self._control.poll()
        for text in control.steering:
            self._commit(state, SteerEntry(text=text))
        if control.cancelled:
            return Stop(
                Outcome.CANCELLED,
                "cancelled by an operator",
                recover_output(state.steps, "") or "The task was cancelled.",
            )
        return None

    def _check_limits(self, state: LoopState) -> None:
        self._limits.check_iterations(state.iterations)
        last = state.steps[-1].usage if state.steps else Usage()
        self._limits.check_tokens(state.usage.total_tokens, last.total_tokens)
        self._limits.check_cost(state.usage.cost_usd, last.cost_usd or 0.0)
        self._limits.check_deadline(self._remaining())

    def _offered_tools(self) -> list[ToolSpec]:
        tools = list(self._toolbox.offered())
        if self._settings.require_done_tool:
            tools.append(DONE_TOOL)
        return tools

    async def _ask(
        self,
        state: LoopState,
        tools: Sequence[ToolSpec],
        *,
        step: int,
        max_output_tokens: int | None = None,
        final: bool = False,
    ) -> ModelResponse:
        timeout_s = max(0.001, min(self._remaining(), self._settings.llm_timeout_cap_s))
        request = ModelRequest(
            system=self._system,
            messages=state.messages,
            tools=tools,
            max_output_tokens=max_output_tokens or self._settings.max_output_tokens,
            temperature=self._settings.temperature,
            timeout_s=timeout_s,
        )
        started = time.perf_counter()
        status = "ok"
        response: ModelResponse | None = None
        try:
            with anyio.fail_after(timeout_s + 1):
                response = await self._model.complete(request)
            return response
        except TimeoutError:
            status = "timeout"
            raise ModelUnavailable(
                f"model {self._model.name!r} did not answer within {timeout_s:.1f} s",
                provider=self._model.provider,
                model=self._model.name,
            ) from None
        except WorkerError as exc:
            status = exc.code
            raise
        finally:
            self._observe_llm_call(step, response, status, time.perf_counter() - started, final)

    def _observe_llm_call(
        self,
        step: int,
        response: ModelResponse | None,
        status: str,
        duration_s: float,
        final: bool,
    ) -> None:
        provider = response.provider if response else self._model.provider
        model = response.model if response else self._model.name
        usage = response.usage if response else None
        self.events.emit(
            LlmCalled(
                step=step,
                provider=provider,
                model=model,
                status=status,
                usage=usage if usage is not None else Usage(),
                duration_s=duration_s,
                stop_reason=response.stop_reason if response else None,
                final=final,
            )
        )
        log_event(
            "llm_call",
            task=self._task_id,
            agent=self._agent_id,
            step=step,
            provider=provider,
            model=model,
            status=status,
            tokens_input=usage.input_tokens if usage else 0,
            tokens_output=usage.output_tokens if usage else 0,
            stop_reason=response.stop_reason.value if response else None,
            duration_ms=round(duration_s * 1000, 2),
        )

    def _decide(self, response: ModelResponse) -> NextStep:
        if self._settings.require_done_tool:
            for call in response.tool_calls:
                if call.name == DONE_TOOL.name:
                    return FinalAnswer(_done_answer(call) or response.text)
            if not response.tool_calls:
                return Nudge(DONE_TOOL_REMINDER)
        if not response.tool_calls:
            return FinalAnswer(response.text)
        return RunTools(response.tool_calls)

    async def _run_tools(self, state: LoopState, calls: tuple[ToolCall, ...]) -> Stop | None:
        step = state.steps[-1].index
        records = []
        for call in calls:
            if self._guard.repeats_too_often(call):
                return Stop(
                    Outcome.TOOL_LOOP,
                    f"tool {call.name!r} called with the same arguments more than "
                    f"{self._settings.max_same_call_repeats} times",
                )
            timeout_s = max(0.001, min(self._remaining(), self._settings.tool_timeout_cap_s))
            index = len(state.steps[-1].tool_calls) + 1
            record = await self._dispatcher.run(step, index, call, timeout_s)
            self._commit(state, ToolEntry(step=step, record=record))
            records.append(record)
        failed = sum(1 for record in records if record.is_error)
        self.events.emit(StepFinished(step=step, tool_calls=len(records), failed_tool_calls=failed))
        if self._guard.step_finished(records):
            return Stop(
                Outcome.TOOL_LOOP,
                f"{self._settings.max_consecutive_error_steps} consecutive steps whose tool calls "
                "all failed",
            )
        return None

    async def _wind_down(self, state: LoopState, limit: LimitReached) -> Stop:
        """Stop calling tools; ask once, without tools, for an answer within what is left."""
        outcome = _LIMIT_OUTCOMES[limit.limit]
        fallback = FALLBACK_ANSWER.format(limit=limit.limit)
        max_output_tokens = self._room_for_final_answer(state, limit.limit)
        if max_output_tokens == 0:
            return self._closing(outcome, limit.message, recover_output(state.steps, ""), fallback)
        self._commit(state, SteerEntry(text=WIND_DOWN_PROMPT.format(detail=limit.message)))
        step = len(state.steps) + 1
        try:
            response = await self._ask(
                state, (), step=step, max_output_tokens=max_output_tokens, final=True
            )
        except (ModelError, TimeoutError) as exc:
            log_event("final_answer_failed", "warning", task=self._task_id, error=str(exc))
            return self._closing(outcome, limit.message, recover_output(state.steps, ""), fallback)
        answer = ModelResponse(
            text=response.text,
            stop_reason=response.stop_reason,
            usage=response.usage,
            provider=response.provider,
            model=response.model,
        )  # any tool calls in the closing answer are dropped: no tools run after a limit
        self._commit(state, ResponseEntry(step=step, response=answer, final=True))
        closing = recover_output(state.steps, answer.text)
        return self._closing(outcome, limit.message, closing, fallback)

    @staticmethod
    def _closing(outcome: Outcome, detail: str, answer: str, fallback: str) -> Stop:
        if answer.strip():
            return Stop(outcome, detail, answer)
        return Stop(outcome, detail, fallback, fallback=True)

    def _room_for_final_answer(self, state: LoopState, limit: str) -> int | None:
        """Output tokens the closing call may use: None for the default, 0 for no call at all.

        The closing call reads the conversation so far; what it may still spend is its answer.
        """
        if limit == "deadline":
            return 0 if self._remaining() < 0.5 else None
        if limit == "max_tokens":
            left = self._limits.max_tokens - state.usage.total_tokens
            return min(left, self._settings.max_output_tokens or left) if left >= 32 else 0
        if limit == "budget":
            spent = state.usage.cost_usd or 0.0
            left_usd = (self._limits.max_cost_usd or 0.0) - spent
            return CLOSING_ANSWER_TOKENS if left_usd > 0 else 0
        return None

    def _finish(self, state: LoopState, text: str) -> Stop:
        return Stop(Outcome.COMPLETED, "", recover_output(state.steps, text))

    # --- state -------------------------------------------------------------------------------

    def _commit(self, state: LoopState, entry: JournalEntry) -> None:
        self._journal.append(entry)
        self._apply(state, entry)

    def _apply(self, state: LoopState, entry: JournalEntry) -> None:
        state.apply(entry)
        if isinstance(entry, ToolEntry):
            self._compactor.add(len(state.messages) - 1, len(entry.record.content))
            self._compactor.compact(state.messages)

    def _remaining(self) -> float:
        return self._deadline - self._clock()


def _done_answer(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return ""
    answer = arguments.get("answer") if isinstance(arguments, dict) else None
    return answer if isinstance(answer, str) else ""
