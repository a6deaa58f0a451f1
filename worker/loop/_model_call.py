"""One model call of a run: budget it, make it within the time left, observe it."""

from __future__ import annotations

import time
from collections.abc import Sequence

from worker.exceptions import ContextTooLong, ModelUnavailable, WorkerError
from worker.loop._budget import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    MIN_CLOSING_OUTPUT_TOKENS,
    MIN_STEP_OUTPUT_TOKENS,
    CallPlan,
    InputEstimator,
    plan_call,
)
from worker.loop._clock import RunClock
from worker.loop._contract import LoopSettings
from worker.loop._events import EventBus, LlmCalled
from worker.loop._limits import Limit, LimitReached
from worker.loop._state import LoopState
from worker.loop._timeout import call_timeout
from worker.models import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolSpec,
    Usage,
    joined_system,
    with_text_calls,
)

# How far past its timeout a call may run before the loop's own backstop cuts it.
_CALL_BACKSTOP_S = 0.5
# Of a bounded context window, the part kept free for the answer (a quarter).
ANSWER_SHARE_OF_WINDOW = 4


class ModelCaller:
    """Asks the model for the next turn of a run, within what the run may still spend."""

    def __init__(
        self,
        model: Model,
        *,
        system: str,
        system_context: str = "",
        settings: LoopSettings,
        run_clock: RunClock,
        events: EventBus,
    ) -> None:
        self._model = model
        self._system = system
        self._system_context = system_context
        self._full_system = joined_system(system, system_context)
        self._settings = settings
        self._run_clock = run_clock
        self._events = events
        self._estimator = InputEstimator()

    def plan(
        self, state: LoopState, tools: Sequence[ToolSpec], *, closing: bool, extra: str = ""
    ) -> CallPlan:
        """What the next call may spend; LimitReached when not even a minimal call fits."""
        chars, input_tokens = self._input(state, tools, extra)
        wanted = self._settings.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        window = self._settings.context_window_tokens
        if window is not None:
            # Prompt and answer share the window: the answer gets what the prompt leaves.
            wanted = max(MIN_CLOSING_OUTPUT_TOKENS, min(wanted, window - input_tokens))
        return plan_call(
            self._settings.limits,
            state.usage,
            input_tokens=input_tokens,
            input_chars=chars,
            wanted_output_tokens=wanted,
            minimum_output_tokens=MIN_CLOSING_OUTPUT_TOKENS if closing else MIN_STEP_OUTPUT_TOKENS,
            price=self._settings.price,
            # A closing call is the last: only a known price can refuse it.
            last_call=state.steps[-1].usage if state.steps and not closing else None,
        )

    def tokens_over_window(
        self, state: LoopState, tools: Sequence[ToolSpec], extra: str, window: int
    ) -> int:
        """How many tokens the next request is over ``window``, keeping room for an answer."""
        _, input_tokens = self._input(state, tools, extra)
        wanted = self._settings.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        answer_room = min(wanted, max(MIN_STEP_OUTPUT_TOKENS, window // ANSWER_SHARE_OF_WINDOW))
        return input_tokens + answer_room - window

    def message_changed(self, state: LoopState, index: int) -> None:
        """Message ``index`` of the run's conversation was cut in place."""
        self._estimator.message_changed(state.messages, index)

    def chars_per_token(self) -> float:
        """Characters per input token, as the estimate counts them now (the safe side)."""
        return self._estimator.chars_per_token_now()

    def _input(self, state: LoopState, tools: Sequence[ToolSpec], extra: str) -> tuple[int, int]:
        """(characters, estimated tokens) of the next request."""
        chars = self._estimator.request_chars(self._full_system, state.messages, tools) + len(extra)
        messages = len(state.messages) + (1 if extra else 0)
        return chars, self._estimator.estimate(chars, messages)

    async def ask(
        self,
        state: LoopState,
        tools: Sequence[ToolSpec],
        *,
        step: int,
        plan: CallPlan,
        final: bool = False,
        messages: Sequence[Message] | None = None,
    ) -> ModelResponse:
        """One model call within its budget; LimitReached when the deadline cut it.

        ``messages`` replaces the run's conversation for this one call (the plain retelling
        of a closing retry); the run's state is not changed by it.
        """
        cap_s = self._settings.llm_timeout_cap_s
        clock = self._run_clock
        timeout_s = clock.closing_timeout(cap_s) if final else clock.step_timeout(cap_s)
        request = self._request(
            list(messages) if messages is not None else state.messages,
            tools,
            plan=plan,
            final=final,
            timeout_s=timeout_s,
        )
        started = time.perf_counter()
        status = "ok"
        response: ModelResponse | None = None
        try:
            with call_timeout(timeout_s + _CALL_BACKSTOP_S):
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
        except ContextTooLong as exc:
            status = exc.code
            if exc.prompt_tokens:  # the provider's count: the estimate learns it
                self._estimator.observe(plan.input_chars, exc.prompt_tokens)
            raise
        except WorkerError as exc:
            status = exc.code
            raise
        finally:
            self._observe(step, response, status, time.perf_counter() - started, final)
        self._estimator.observe(plan.input_chars, response.usage.input_tokens)
        # A call the provider left in the text is parsed; with no tool callable (a closing
        # turn) an imitation of one is taken out, so it is never read as the answer.
        callable_tools = [] if final else [tool.name for tool in tools]
        return with_text_calls(response, callable_tools, id_prefix=f"text-{step}")

    def _request(
        self,
        messages: list[Message],
        tools: Sequence[ToolSpec],
        *,
        plan: CallPlan,
        final: bool,
        timeout_s: float,
    ) -> ModelRequest:
        return ModelRequest(
            system=self._system,
            system_context=self._system_context,
            # A closing call is the run's last; a call offered no tool ends the run with its
            # answer (only a rare empty or cut answer asks again). A cache write of their
            # conversation would not be read back (docs/concepts/prompt-cache.md).
            last_call=final or not tools,
            messages=messages,
            tools=tools,
            # A closing call lists the run's tools (its prefix stays the one the steps left
            # in the provider's cache) and calls none.
            tools_callable=not final,
            max_output_tokens=plan.max_output_tokens,
            temperature=self._settings.temperature,
            timeout_s=max(0.001, timeout_s),
            response_schema=self._settings.response_schema,
            response_schema_name=self._settings.response_schema_name,
        )

    def _raise_if_deadline(self, timeout_s: float, cap_s: float) -> None:
        """A call cut by the task's deadline ends the run as `deadline`, never a requeue."""
        if self._run_clock.reached_by(timeout_s, cap_s):
            raise LimitReached(
                f"max_duration_s reached: the model call was cut by the task's deadline "
                f"after {timeout_s:.1f} s",
                limit=Limit.DEADLINE,
            )

    def _observe(
        self,
        step: int,
        response: ModelResponse | None,
        status: str,
        duration_s: float,
        final: bool,
    ) -> None:
        provider = response.provider if response else self._model.provider
        model = response.model if response else self._model.name
        self._events.emit(
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
