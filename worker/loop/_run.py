"""The reason → tool → observe loop.

run():   restore from the journal → until a next step says stop:
         take control messages → check limits → budget the call → ask the model →
         check what it spent → decide → run tools
Limits reached: one last tool-less call for a final answer within what is left.

Time is one absolute deadline (epoch seconds) that re-runs of the task share;
tokens and cost are budgeted before each call (``_budget``), and a call that
spent past a limit anyway ends the run with that limit's outcome.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from worker.exceptions import (
    AutonomyViolation,
    LimitReached,
    ModelError,
    ModelUnavailable,
    WorkerError,
)
from worker.logs import log_event
from worker.loop._budget import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    MIN_CLOSING_OUTPUT_TOKENS,
    MIN_STEP_OUTPUT_TOKENS,
    CallPlan,
    InputEstimator,
    plan_call,
)
from worker.loop._clock import MIN_CLOSING_CALL_S, DeadlineToolbox, RunClock
from worker.loop._contract import ControlSource, LoopSettings, RunResult
from worker.loop._dispatch import DONE_TOOL, CanExecuteTool, ToolDispatcher, ToolLoopGuard
from worker.loop._events import (
    EventBus,
    LlmCalled,
    LoopObserver,
    StepFinished,
    StepStarted,
    log_observer,
)
from worker.loop._output import FALLBACK_ANSWER, Compactor, recover_output
from worker.loop._state import (
    Journal,
    JournalEntry,
    LoopState,
    MemoryJournal,
    ResponseEntry,
    SteerEntry,
    ToolCallRecord,
    ToolEntry,
)
from worker.models import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from worker.task import Outcome
from worker.tools import Toolbox

WIND_DOWN_PROMPT = (
    "You have reached this task's limit ({detail}). Do not call any tool. "
    "Reply now with your final answer, based on what you already have."
)
DONE_TOOL_REMINDER = (
    "When you are finished, call the task_complete tool with your final answer. "
    "If you are not finished, continue with your tools."
)
DEADLINE_SKIPPED_TOOL = "Error: not run: the task's deadline was reached before this call"
# How far past its timeout a call may run before the loop's own backstop cuts it.
_CALL_BACKSTOP_S = 0.5
_LIMIT_OUTCOMES = {
    "max_iterations": Outcome.MAX_ITERATIONS,
    "max_tokens": Outcome.MAX_TOKENS,
    "deadline": Outcome.DEADLINE,
    "budget": Outcome.BUDGET,
}


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._model = model
        self._toolbox = toolbox
        self._system = system
        self._settings = settings
        self._limits = settings.limits
        self._task_id = task_id
        self._agent_id = agent_id
        # The run's own log lines come from its events, after the caller's observers.
        self.events = EventBus(
            [
                *observers,
                log_observer(
                    task_id=task_id, agent_id=agent_id, strict_grants=settings.strict_grants
                ),
            ]
        )
        self._control = control
        self._journal: Journal = journal if journal is not None else MemoryJournal()
        self._clock = clock
        self._run_clock = RunClock(
            deadline_epoch=0.0, reserve_s=self._limits.reserve_s, clock=clock
        )
        self._estimator = InputEstimator()
        self._dispatcher = ToolDispatcher(
            DeadlineToolbox(toolbox, lambda: self._run_clock.deadline_epoch),
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
        deadline = self._settings.deadline_epoch
        self._run_clock.deadline_epoch = (
            deadline if deadline is not None else started + self._limits.max_duration_s
        )
        state = LoopState(messages=list(messages))
        for entry in resume:
            self._apply(state, entry)
        self._guard.replay(state.steps)
        error: BaseException | None = None
        try:
            # Backstop only: every call already has the remaining time as its timeout.
            with anyio.fail_after(max(0.0, self._remaining()) + 5):
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
            step = len(state.steps) + 1
            tools = self._offered_tools()
            try:
                self._check_limits(state)
                plan = self._plan(state, tools, closing=False)
                self.events.emit(StepStarted(step=step))
                response = await self._ask(state, tools, step=step, plan=plan)
            except LimitReached as limit:
                return await self._wind_down(state, limit)
            self._commit(state, ResponseEntry(step=step, response=response))
            overspent = self._overspent(state, response)
            if overspent is not None:
                return overspent
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
        self._limits.check_deadline(self._remaining())
        self._limits.check_spent(state.usage)  # a resumed run may already be past one

    def _plan(
        self, state: LoopState, tools: Sequence[ToolSpec], *, closing: bool, extra: str = ""
    ) -> CallPlan:
        """What the next call may spend; LimitReached when not even a minimal call fits."""
        chars = self._estimator.request_chars(self._system, state.messages, tools) + len(extra)
        messages = len(state.messages) + (1 if extra else 0)
        return plan_call(
            self._limits,
            state.usage,
            input_tokens=self._estimator.estimate(chars, messages),
            input_chars=chars,
            wanted_output_tokens=self._settings.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS,
            minimum_output_tokens=MIN_CLOSING_OUTPUT_TOKENS if closing else MIN_STEP_OUTPUT_TOKENS,
            price=self._settings.price,
            # A closing call is the last: only a known price can refuse it.
            last_call=state.steps[-1].usage if state.steps and not closing else None,
        )

    def _overspent(self, state: LoopState, response: ModelResponse) -> Stop | None:
        """A call that spent past a limit (the provider ignored its budget) ends the run."""
        try:
            self._limits.check_spent(state.usage)
        except LimitReached as limit:
            answer = "" if response.tool_calls else response.text
            fallback = FALLBACK_ANSWER.format(limit=limit.limit)
            return self._closing(
                _LIMIT_OUTCOMES[limit.limit],
                limit.message,
                recover_output(state.steps, answer),
                fallback,
            )
        return None

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
        plan: CallPlan,
        final: bool = False,
    ) -> ModelResponse:
        """One model call within its budget; LimitReached when the deadline cut it."""
        cap_s = self._settings.llm_timeout_cap_s
        clock = self._run_clock
        timeout_s = clock.closing_timeout(cap_s) if final else clock.step_timeout(cap_s)
        request = ModelRequest(
            system=self._system,
            messages=state.messages,
            tools=tools,
            max_output_tokens=plan.max_output_tokens,
            temperature=self._settings.temperature,
            timeout_s=max(0.001, timeout_s),
        )
        started = time.perf_counter()
        status = "ok"
        response: ModelResponse | None = None
        try:
            with anyio.fail_after(timeout_s + _CALL_BACKSTOP_S):
                response = await self._model.complete(request)
        except TimeoutError:
            status = "timeout"
            self._raise_if_deadline(timeout_s, cap_s)
            raise ModelUnavailable(
                f"model {self._model.name!r} did not answer within {timeout_s:.1f} s",
                provider=self._model.provider,
                model=self._model.name,
            ) from None
        except ModelUnavailable as exc:
            status = exc.code
            self._raise_if_deadline(timeout_s, cap_s)
            raise
        except WorkerError as exc:
            status = exc.code
            raise
        finally:
            self._observe_llm_call(step, response, status, time.perf_counter() - started, final)
        self._estimator.observe(plan.input_chars, response.usage.input_tokens)
        return response

    def _raise_if_deadline(self, timeout_s: float, cap_s: float) -> None:
        """A call cut by the task's deadline ends the run as `deadline`, never a requeue."""
        if self._run_clock.reached_by(timeout_s, cap_s):
            raise LimitReached(
                f"max_duration_s reached: the model call was cut by the task's deadline "
                f"after {timeout_s:.1f} s",
                limit="deadline",
            )

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
        self.events.emit(
            LlmCalled(
                step=step,
                provider=provider,
                model=model,
                status=status,
                usage=response.usage if response else Usage(),
                duration_s=duration_s,
                stop_reason=response.stop_reason if response else None,
                final=final,
            )
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
            timeout_s = self._run_clock.step_timeout(self._settings.tool_timeout_cap_s)
            index = len(state.steps[-1].tool_calls) + 1
            if timeout_s <= 0:
                # Out of time: the calls left get an error result (every call the model made
                # needs one) and the next limit check winds the run down.
                self._skip_calls(state, step, tuple(state.steps[-1].pending_calls))
                return None
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

    def _skip_calls(self, state: LoopState, step: int, calls: tuple[ToolCall, ...]) -> None:
        for call in calls:
            record = ToolCallRecord(
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
                server="",
                outcome="deadline",
                is_error=True,
                content=DEADLINE_SKIPPED_TOOL,
            )
            self._commit(state, ToolEntry(step=step, record=record))

    async def _wind_down(self, state: LoopState, limit: LimitReached) -> Stop:
        """Stop calling tools; ask once, without tools, for an answer within what is left."""
        outcome = _LIMIT_OUTCOMES[limit.limit]
        fallback = FALLBACK_ANSWER.format(limit=limit.limit)
        prompt = WIND_DOWN_PROMPT.format(detail=limit.message)
        try:
            if self._run_clock.remaining() < MIN_CLOSING_CALL_S:
                raise LimitReached("no time left for a closing answer", limit="deadline")
            plan = self._plan(state, (), closing=True, extra=prompt)
        except LimitReached as no_room:
            log_event("final_answer_skipped", task=self._task_id, reason=no_room.message)
            return self._closing(outcome, limit.message, recover_output(state.steps, ""), fallback)
        self._commit(state, SteerEntry(text=prompt))
        step = len(state.steps) + 1
        try:
            response = await self._ask(state, (), step=step, plan=plan, final=True)
        except (ModelError, TimeoutError, LimitReached) as exc:
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
        overspent = self._overspent(state, answer)
        if overspent is not None:
            return overspent
        closing = recover_output(state.steps, answer.text)
        return self._closing(outcome, limit.message, closing, fallback)

    @staticmethod
    def _closing(outcome: Outcome, detail: str, answer: str, fallback: str) -> Stop:
        if answer.strip():
            return Stop(outcome, detail, answer)
        return Stop(outcome, detail, fallback, fallback=True)

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
        return self._run_clock.remaining()


def _done_answer(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return ""
    answer = arguments.get("answer") if isinstance(arguments, dict) else None
    return answer if isinstance(answer, str) else ""
