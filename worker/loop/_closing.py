"""The closing call: one last request for the run's answer, no tool callable.

A run that winds down (a limit reached) or closes (a reply delivered, a write refused, a
loop guard tripped) asks the model once more, without letting it call a tool:

    room for it?   time left for a call (MIN_CLOSING_CALL_S), the window cut to fit,
                   the call budgeted (tokens, cost); otherwise no call (None)
    ask            the closing prompt as a message of its own; the run's tools listed
                   but none callable (the request's prefix stays the one a provider's
                   prompt cache holds) when the budget has room for them; tool calls in
                   the answer are dropped
    no answer?     after tool calls, once more with the conversation retold in plain
                   text (``plain_history``) and no tool listed: a small model copies its
                   own calls otherwise
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from worker.exceptions import ModelError
from worker.logs import log_event
from worker.loop._clock import MIN_CLOSING_CALL_S, RunClock
from worker.loop._limits import Limit, LimitReached
from worker.loop._model_call import ModelCaller
from worker.loop._output import is_answer, plain_history
from worker.loop._state import JournalEntry, LoopState, ResponseEntry, SteerEntry
from worker.models import ModelResponse, ToolSpec


class ClosingCall:
    """The closing call of one run; ``commit`` journals what it adds to the run's state."""

    def __init__(
        self,
        model: ModelCaller,
        clock: RunClock,
        *,
        task_id: str,
        tools: Callable[[], Sequence[ToolSpec]],
        fit_window: Callable[[LoopState, Sequence[ToolSpec], str], None],
        commit: Callable[[LoopState, JournalEntry], None],
    ) -> None:
        self._model = model
        self._clock = clock
        self._task_id = task_id
        self._tools = tools
        self._fit_window = fit_window
        self._commit = commit

    async def answer(
        self, state: LoopState, prompt: str, *, retell: bool = False, worker_words: str = ""
    ) -> ModelResponse | None:
        """The closing call; None when there was no room for it or it failed.

        Any tool calls in its answer are dropped: no tools run after a run starts closing.
        With ``retell``, a closing call that brought no answer (only an imitation of a call,
        or nothing) after tool calls is made once more with the conversation retold in plain
        text (``plain_history``): the same model, no longer primed by its own calls.
        """
        answer = await self._call(state, prompt)
        if answer is None or is_answer(answer.text, worker_words=worker_words) or not retell:
            return answer
        if not any(message.tool_calls for message in state.messages):
            return answer
        retold = await self._call(state, prompt, retold=True)
        return retold if retold is not None else answer

    async def _call(
        self, state: LoopState, prompt: str, *, retold: bool = False
    ) -> ModelResponse | None:
        try:
            if self._clock.remaining() < MIN_CLOSING_CALL_S:
                raise LimitReached("no time left for a closing answer", limit=Limit.DEADLINE)
            extra = "" if retold else prompt  # a retelling's prompt is in the state already
            tools = () if retold else self._tools()
            self._fit_window(state, tools, extra)
            try:
                plan = self._model.plan(state, tools, closing=True, extra=extra)
            except LimitReached:
                if not tools:
                    raise
                # The tools' tokens do not fit what the run has left: an answer matters
                # more than a cached prefix.
                tools = ()
                plan = self._model.plan(state, tools, closing=True, extra=extra)
        except LimitReached as no_room:
            log_event("final_answer_skipped", task=self._task_id, reason=no_room.message)
            return None
        if not retold:
            self._commit(state, SteerEntry(text=prompt))
        step = len(state.steps) + 1
        # Retold: the conversation without the closing answer that had none.
        messages = plain_history(state.messages[:-1]) if retold else None
        try:
            response = await self._model.ask(
                state, tools, step=step, plan=plan, final=True, messages=messages
            )
        except (ModelError, TimeoutError, LimitReached) as exc:
            log_event("final_answer_failed", "warning", task=self._task_id, error=str(exc))
            return None
        answer = ModelResponse(
            text=response.text,
            stop_reason=response.stop_reason,
            usage=response.usage,
            provider=response.provider,
            model=response.model,
        )
        self._commit(state, ResponseEntry(step=step, response=answer, final=True))
        return answer
