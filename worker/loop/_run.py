"""The reason → tool → observe loop.

run():   restore from the journal → until a step says stop, dispatch on what it returns:
         AskModel     take control messages → check limits → budget the call →
                      ask the model → check what it spent → decide
         RunTools     run the calls → watch for a tool loop
         Nudge        remind the model of the done tool → AskModel
         WindDown     one last tool-less call for a final answer within what is left
         Close        one tool-less closing call: the answer was delivered, a write was
                      refused or a loop guard tripped; its answer completes the run
         FinalAnswer / Stop  the run's outcome

Time is one absolute deadline (epoch seconds) that re-runs of the task share;
tokens and cost are budgeted before each call (``_budget``), and a call that
spent past a limit anyway ends the run with that limit's outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from worker._hooks import allow_every_tool
from worker.exceptions import ContextTooLong
from worker.logs import log_event
from worker.loop._budget import CallPlan
from worker.loop._clock import DeadlineToolbox, RunClock
from worker.loop._closing import ClosingCall
from worker.loop._contract import NO_CONTROL, Closing, ControlSource, LoopSettings, RunResult
from worker.loop._dispatch import (
    DONE_TOOL,
    CanExecuteTool,
    RepeatedReads,
    ToolDispatcher,
    ToolLoopGuard,
    repeated_read_note,
)
from worker.loop._events import EventBus, LoopObserver, StepFinished, StepStarted, log_observer
from worker.loop._limits import Limit, LimitReached
from worker.loop._model_call import ModelCaller
from worker.loop._output import Compactor, is_answer, recover_output
from worker.loop._state import (
    Journal,
    JournalEntry,
    LoopState,
    MemoryJournal,
    ResponseEntry,
    SteerEntry,
    ToolCallRecord,
    ToolEntry,
    ToolOutcome,
)
from worker.loop._steps import (
    AskModel,
    Close,
    FinalAnswer,
    NextStep,
    Nudge,
    RunTools,
    Stop,
    WindDown,
    decide,
)
from worker.loop._timeout import call_timeout
from worker.loop._window import fit_window
from worker.models import Message, Model, ModelResponse, ToolCall, ToolSpec
from worker.task import Outcome
from worker.tools import Toolbox

WIND_DOWN_PROMPT = (
    "You have reached this task's limit ({detail}). Do not call any tool. "
    "Reply now with your final answer, based on what you already have."
)
CLOSING_PROMPT = (
    "{reason} Do not call any tool. "
    "Reply now with your final answer, based on what you already have."
)
DEADLINE_SKIPPED_TOOL = "Error: not run: the task's deadline was reached before this call"
CLOSED_SKIPPED_TOOL = "Error: not run: the task is closing ({reason})"
NO_ANSWER_REASON = "You wrote no answer yet."


class AgentLoop:
    """Runs one task's loop against a model and a toolbox, journaling every change."""

    def __init__(
        self,
        *,
        model: Model,
        toolbox: Toolbox,
        system: str,
        system_context: str = "",
        settings: LoopSettings,
        task_id: str,
        agent_id: str,
        observers: Sequence[LoopObserver] = (),
        control: ControlSource = NO_CONTROL,
        can_execute_tool: CanExecuteTool = allow_every_tool,
        journal: Journal | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._toolbox = toolbox
        self._settings = settings
        self._limits = settings.limits
        self._task_id = task_id
        # The run's own log lines come from its events, after the caller's observers.
        self.events = EventBus([*observers, log_observer(task_id=task_id, agent_id=agent_id)])
        self._control = control
        self._journal: Journal = journal if journal is not None else MemoryJournal()
        self._clock = clock
        self._run_clock = RunClock(
            deadline_epoch=0.0, reserve_s=self._limits.reserve_s, clock=clock
        )
        self._model = ModelCaller(
            model,
            system=system,
            system_context=system_context,
            settings=settings,
            run_clock=self._run_clock,
            events=self.events,
        )
        self._dispatcher = ToolDispatcher(
            DeadlineToolbox(toolbox, lambda: self._run_clock.deadline_epoch),
            task_id=task_id,
            agent_id=agent_id,
            events=self.events,
            max_output_chars=settings.tool_output_max_chars,
            can_execute_tool=can_execute_tool,
        )
        self._guard = ToolLoopGuard(
            max_same_call_repeats=settings.max_same_call_repeats,
            max_consecutive_error_steps=settings.max_consecutive_error_steps,
        )
        self._reads = RepeatedReads()
        self._compactor = Compactor(settings.context_budget_chars)
        self._closing = ClosingCall(
            self._model,
            self._run_clock,
            task_id=task_id,
            tools=self._offered_tools,
            fit_window=self._fit_window,
            commit=self._commit,
        )

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
        state = self._restore(messages, resume)
        try:
            # Backstop only: every call already has the remaining time as its timeout.
            with call_timeout(max(0.0, self._run_clock.remaining()) + 5):
                stop = await self._run_steps(state)
        except TimeoutError:
            stop = Stop(Outcome.DEADLINE, "the task's wall-clock budget ran out mid-call")
        except Exception as exc:
            stop = Stop.for_error(exc)
        return self._result(state, stop, started)

    def _restore(self, messages: Sequence[Message], resume: Sequence[JournalEntry]) -> LoopState:
        state = LoopState(messages=list(messages))
        for entry in resume:
            self._apply(state, entry)
        self._guard.replay(state.steps)
        for step in state.steps:
            for record in step.tool_calls:
                if self._read_only(record.name):
                    self._reads.remember(step.index, record)
        return state

    async def _run_steps(self, state: LoopState) -> Stop:
        next_step = self._resume_point(state)
        while True:
            match next_step:
                case Stop():
                    return next_step
                case FinalAnswer(text=text):
                    if not is_answer(text) and not state.steps[-1].final:
                        # Only an announcement ("Let me check."), or nothing: ask once more.
                        next_step = Close(Closing(reason=NO_ANSWER_REASON))
                        continue
                    return Stop(Outcome.COMPLETED, "", recover_output(state.steps, text))
                case AskModel():
                    next_step = await self._ask_model(state)
                case RunTools(calls=calls):
                    next_step = await self._run_tools(state, calls)
                case Nudge(text=text):
                    self._commit(state, SteerEntry(text=text))
                    next_step = AskModel()
                case WindDown():
                    next_step = await self._wind_down(state, next_step)
                case Close():
                    next_step = await self._close(state, next_step)
                case _:
                    raise TypeError(f"unknown next step {next_step!r}")

    def _result(self, state: LoopState, stop: Stop, started: float) -> RunResult:
        output = stop.output or recover_output(state.steps, "")
        fallback = stop.fallback
        if stop.outcome is Outcome.DEADLINE and not output:
            output, fallback = Limit.DEADLINE.fallback_answer, True
        return RunResult(
            outcome=stop.outcome,
            output=output,
            fallback=fallback,
            state=state,
            duration_s=self._clock() - started,
            detail=stop.detail,
            error=stop.error,
        )

    # --- steps -------------------------------------------------------------------------------

    @staticmethod
    def _resume_point(state: LoopState) -> NextStep:
        """Where a run restored from a checkpoint goes on (a fresh run: ask the model)."""
        if not state.steps:
            return AskModel()
        last = state.steps[-1]
        if last.pending_calls:  # resumed mid-step: finish the calls that had not run
            return RunTools(tuple(last.pending_calls))
        if not last.requested_calls:  # resumed after the answer
            return FinalAnswer(last.text)
        return AskModel()

    async def _ask_model(self, state: LoopState) -> NextStep:
        cancelled = await self._take_control(state)
        if cancelled is not None:
            return cancelled
        step = len(state.steps) + 1
        tools = self._offered_tools()
        try:
            self._limits.check_step(state, remaining_s=self._run_clock.remaining())
            self._fit_window(state, tools)
            plan = self._model.plan(state, tools, closing=False)
            if self.events.wants(StepStarted):
                self.events.emit(StepStarted(step=step))
            response = await self._ask_within_window(state, tools, step, plan)
        except LimitReached as limit:
            return WindDown(limit.limit, limit.message)
        self._commit(state, ResponseEntry(step=step, response=response))
        overspent = self._overspent(state, response)
        if overspent is not None:
            return overspent
        return decide(response, require_done_tool=self._settings.require_done_tool)

    async def _ask_within_window(
        self, state: LoopState, tools: Sequence[ToolSpec], step: int, plan: CallPlan
    ) -> ModelResponse:
        """Ask; a prompt the provider still found too long for the window (the estimate was
        short: digits, timestamps and tags take more tokens than prose) is cut again with
        the provider's own count, and asked once more."""
        try:
            return await self._model.ask(state, tools, step=step, plan=plan)
        except ContextTooLong as too_long:
            if self._settings.context_window_tokens is None or not too_long.prompt_tokens:
                raise
            log_event("context_too_long", task=self._task_id, prompt_tokens=too_long.prompt_tokens)
        self._fit_window(state, tools)
        plan = self._model.plan(state, tools, closing=False)
        return await self._model.ask(state, tools, step=step, plan=plan)

    async def _take_control(self, state: LoopState) -> Stop | None:
        """Apply steering messages; a Stop when an operator cancelled the task."""
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

    def _offered_tools(self) -> list[ToolSpec]:
        # By name: the same tools in the same order in every task, whatever order the servers
        # answered in (a prompt cache keeps only a byte-identical prefix).
        tools = sorted(self._toolbox.offered(), key=lambda tool: tool.name)
        if self._settings.require_done_tool:
            tools.append(DONE_TOOL)
        return tools

    def _untried_reads(self, state: LoopState, repeated: str) -> list[str]:
        """Read-only tools offered and not yet called: another server's first, then by name."""
        used = {record.name for step in state.steps for record in step.tool_calls}
        untried = [
            tool.name
            for tool in self._offered_tools()
            if tool.name not in used and self._read_only(tool.name)
        ]
        server = repeated.partition("__")[0]
        return sorted(untried, key=lambda name: (name.partition("__")[0] == server, name))

    def _overspent(self, state: LoopState, response: ModelResponse) -> Stop | None:
        """A call that spent past a limit (the provider ignored its budget) ends the run."""
        try:
            self._limits.check_spent(state.usage)
        except LimitReached as limit:
            answer = "" if response.tool_calls else response.text
            return Stop.at_limit(limit.limit, limit.message, recover_output(state.steps, answer))
        return None

    async def _run_tools(self, state: LoopState, calls: tuple[ToolCall, ...]) -> NextStep:
        step = state.steps[-1].index
        records = []
        notes = []
        for call in calls:
            if self._guard.repeats_too_often(call):
                return self._loop_guard_tripped(
                    state,
                    f"tool {call.name!r} called with the same arguments more than "
                    f"{self._settings.max_same_call_repeats} times",
                )
            timeout_s = self._run_clock.step_timeout(self._settings.tool_timeout_cap_s)
            index = len(state.steps[-1].tool_calls) + 1
            if timeout_s <= 0:
                # Out of time: the calls left get an error result (every call the model made
                # needs one) and the next limit check winds the run down.
                self._skip_pending(state, ToolOutcome.DEADLINE, DEADLINE_SKIPPED_TOOL)
                return AskModel()
            earlier = self._reads.earlier(call) if self._read_only(call.name) else None
            if earlier is not None:
                record = self._reads.repeat(call, earlier[1])
                notes.append(
                    repeated_read_note(call.name, earlier[0], self._untried_reads(state, call.name))
                )
            else:
                record = await self._dispatcher.run(step, index, call, timeout_s)
            self._commit(state, ToolEntry(step=step, record=record))
            records.append(record)
            if self._read_only(call.name):
                self._reads.remember(step, record)
            closing = self._settings.call_rules.closing_after(record)
            if closing is not None:
                self._skip_pending(
                    state, ToolOutcome.REFUSED, CLOSED_SKIPPED_TOOL.format(reason=closing.reason)
                )
                return Close(closing)
        if self.events.wants(StepFinished):
            failed = sum(1 for record in records if record.is_error)
            self.events.emit(
                StepFinished(step=step, tool_calls=len(records), failed_tool_calls=failed)
            )
        if self._guard.step_finished(records):
            return self._loop_guard_tripped(
                state,
                f"{self._settings.max_consecutive_error_steps} consecutive steps whose tool calls "
                "all failed",
            )
        if notes:  # the worker's own words, after the step's (untrusted) results
            self._commit(state, SteerEntry(text=" ".join(notes)))
        return AskModel()

    def _read_only(self, tool: str) -> bool:
        return self._settings.call_rules.read_only(tool)

    def _loop_guard_tripped(self, state: LoopState, detail: str) -> Close:
        """A loop guard stopped the tools: close, and end as tool_loop only without an answer."""
        skipped = CLOSED_SKIPPED_TOOL.format(reason="a tool loop was stopped")
        self._skip_pending(state, ToolOutcome.REFUSED, skipped)
        reason = f"The worker stopped your tool calls: {detail}."
        return Close(Closing(reason=reason), silent_outcome=Outcome.TOOL_LOOP)

    def _skip_pending(self, state: LoopState, outcome: ToolOutcome, content: str) -> None:
        """Give every call of the last step that has not run an error result, unrun:
        ``outcome`` DEADLINE when time ran out, REFUSED when the loop closed the tools."""
        step = state.steps[-1]
        for call in step.pending_calls:
            record = ToolCallRecord(
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
                server="",
                outcome=outcome,
                is_error=True,
                content=content,
            )
            self._commit(state, ToolEntry(step=step.index, record=record))

    async def _wind_down(self, state: LoopState, wind_down: WindDown) -> Stop:
        """Stop calling tools; ask once, without tools, for an answer within what is left."""
        limit, detail = wind_down.limit, wind_down.detail
        answer = await self._closing.answer(
            state, WIND_DOWN_PROMPT.format(detail=detail), retell=True, worker_words=detail
        )
        if answer is None:
            return Stop.at_limit(limit, detail, recover_output(state.steps, ""))
        overspent = self._overspent(state, answer)
        if overspent is not None:
            return overspent
        text = answer.text if is_answer(answer.text, worker_words=detail) else ""
        return Stop.at_limit(limit, detail, recover_output(state.steps, text))

    async def _close(self, state: LoopState, close: Close) -> Stop:
        """Ask once, without tools, for the answer; the run completes when there is one."""
        closing = close.closing
        prompt = CLOSING_PROMPT.format(reason=closing.reason)
        # A delivered reply needs no more answer: no retelling for it.
        answer = await self._closing.answer(
            state, prompt, retell=closing.delivered is None, worker_words=closing.reason
        )
        if answer is not None:
            overspent = self._overspent(state, answer)
            if overspent is not None and closing.delivered is None:
                return overspent
        text = answer.text if answer is not None else ""
        text = text if is_answer(text, worker_words=closing.reason) else ""
        output = recover_output(state.steps, text) if text else ""
        if output or closing.delivered is not None:
            return Stop(Outcome.COMPLETED, closing.reason, output or closing.delivered or "")
        if close.silent_outcome is Outcome.COMPLETED:
            return Stop(Outcome.COMPLETED, closing.reason, "")
        return Stop(close.silent_outcome, closing.reason, recover_output(state.steps, ""))

    def _fit_window(self, state: LoopState, tools: Sequence[ToolSpec], extra: str = "") -> None:
        """Cut the conversation, oldest first, until the next request fits the context window."""
        window = self._settings.context_window_tokens
        if window is None:
            return
        cut = fit_window(
            state.messages,
            over_by=lambda: self._model.tokens_over_window(state, tools, extra, window),
            chars_per_token=self._model.chars_per_token(),
            redact=self._settings.redact,
            changed=lambda index: self._model.message_changed(state, index),
        )
        if cut:
            log_event("context_trimmed", task=self._task_id, cuts=cut, window_tokens=window)

    # --- state -------------------------------------------------------------------------------

    def _commit(self, state: LoopState, entry: JournalEntry) -> None:
        self._journal.append(entry)
        self._apply(state, entry)

    def _apply(self, state: LoopState, entry: JournalEntry) -> None:
        state.apply(entry)
        if isinstance(entry, ToolEntry):
            self._compactor.add(len(state.messages) - 1, len(entry.record.content))
            self._compactor.compact(
                state.messages, lambda index: self._model.message_changed(state, index)
            )
