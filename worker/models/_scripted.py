"""ScriptedModel: a queue of turns, for tests, benchmarks and the offline demo."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from worker.exceptions import ModelError
from worker.models._types import ModelRequest, ModelResponse, StopReason, ToolCall, Usage


@dataclass(slots=True, kw_only=True)
class Turn:
    """One scripted answer. ``tool_calls`` are ``(name, arguments)``; arguments may be raw text."""

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    stop_reason: StopReason | None = None
    input_tokens: int = 10
    output_tokens: int = 5
    cost_usd: float | None = 0.0
    # Of ``input_tokens``, read from and written to a prompt cache.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # Raised instead of answering (to script provider failures).
    error: BaseException | None = None


TurnSource = Turn | Callable[[ModelRequest], Turn | Awaitable[Turn]]


class ScriptedModel:
    """Answers each call with the next scripted turn; records every request it saw.

    A turn may be a callable taking the request, for answers that depend on
    what the loop sent (tool results, steering messages).
    """

    def __init__(
        self, turns: Iterable[TurnSource], *, name: str = "scripted", provider: str = "scripted"
    ) -> None:
        self._turns: deque[TurnSource] = deque(turns)
        self._name = name
        self._provider = provider
        self.requests: list[ModelRequest] = []
        self._call_counter = 0

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def name(self) -> str:
        return self._name

    @property
    def remaining_turns(self) -> int:
        return len(self._turns)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        # The loop keeps appending to the same list: record what this call saw.
        self.requests.append(replace(request, messages=list(request.messages)))
        if not self._turns:
            raise ModelError(
                f"scripted model {self._name!r} has no turn left (call {len(self.requests)})",
                provider=self._provider,
                model=self._name,
            )
        source = self._turns.popleft()
        turn = source(request) if callable(source) else source
        if not isinstance(turn, Turn):
            turn = await turn
        if turn.error is not None:
            raise turn.error
        calls = tuple(self._tool_call(name, args) for name, args in turn.tool_calls)
        stop = turn.stop_reason or (StopReason.TOOL_USE if calls else StopReason.END_TURN)
        return ModelResponse(
            text=turn.text,
            tool_calls=calls,
            stop_reason=stop,
            usage=Usage(
                input_tokens=turn.input_tokens,
                output_tokens=turn.output_tokens,
                cost_usd=turn.cost_usd,
                cache_read_tokens=turn.cache_read_tokens,
                cache_write_tokens=turn.cache_write_tokens,
            ),
            provider=self._provider,
            model=self._name,
        )

    def _tool_call(self, name: str, arguments: dict[str, Any] | str) -> ToolCall:
        self._call_counter += 1
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return ToolCall(id=f"call_{self._call_counter}", name=name, arguments=raw)
