"""Provider-neutral conversation types shared by the loop and every model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol


class StopReason(StrEnum):
    END_TURN = "end_turn"  # anthropic end_turn / stop_sequence, openai stop
    TOOL_USE = "tool_use"  # anthropic tool_use, openai tool_calls
    MAX_TOKENS = "max_tokens"  # anthropic max_tokens, openai length: the answer was truncated
    REFUSAL = "refusal"  # anthropic refusal, openai content_filter
    OTHER = "other"


@dataclass(slots=True, kw_only=True, frozen=True)
class ToolCall:
    """A tool call as the model wrote it. ``arguments`` is the raw JSON text (it may be invalid)."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True, kw_only=True, frozen=True)
class ToolSpec:
    """A tool as offered to the model: ``<server>__<tool>``, its description and JSON schema."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(slots=True, kw_only=True)
class Message:
    """One conversation entry. ``tool`` messages answer the call named by ``tool_call_id``."""

    role: Literal["user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False


@dataclass(slots=True, kw_only=True)
class Usage:
    # Every input token, those read from or written to the provider's prompt cache included.
    input_tokens: int = 0
    output_tokens: int = 0
    # None when the price of the model is unknown: unknown is not free.
    cost_usd: float | None = 0.0
    # Of ``input_tokens``: read from the provider's prompt cache, and written to it.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        if self.cost_usd is None or other.cost_usd is None:
            self.cost_usd = None
        else:
            self.cost_usd += other.cost_usd


@dataclass(slots=True, kw_only=True)
class ModelRequest:
    # The agent's own instructions (its prompt and skills): the same bytes in every task of
    # the agent, so a provider's prompt cache can keep them (``_cache``).
    system: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    max_output_tokens: int | None = None
    temperature: float | None = None
    # Seconds this call may take: the remaining wall-clock budget, capped by the model's default.
    timeout_s: float | None = None
    # JSON schema the answer must follow (structured output); None for free text.
    response_schema: dict[str, Any] | None = None
    response_schema_name: str = "answer"
    # This task's own instructions, read right after ``system`` (the untrusted-content
    # notice with its nonce, the budget line): kept out of the cacheable prefix.
    system_context: str = ""
    # False: ``tools`` are listed but the model may not call one (a closing call). They stay
    # in the request so its prefix is the one the run's earlier calls left in a cache.
    tools_callable: bool = True
    # No later call of this run is expected to send this conversation again (a closing call,
    # a call offered no tool): a cache write of it would not be read back.
    last_call: bool = False

    def full_system(self) -> str:
        """The system prompt as one text (providers without blocks, token estimates)."""
        return joined_system(self.system, self.system_context)


def joined_system(system: str, context: str) -> str:
    """The agent's instructions and the task's as the one system text a model reads."""
    return "\n\n".join(part for part in (system, context) if part)


@dataclass(slots=True, kw_only=True)
class ModelResponse:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: StopReason = StopReason.END_TURN
    usage: Usage = field(default_factory=Usage)
    provider: str = ""
    model: str = ""
    # How many attempts the retry layer made (1 = no retry).
    attempts: int = 1


class Model(Protocol):
    """Anything that turns a conversation into the next assistant turn.

    Implementations raise ``ModelAuthError``, ``ModelRequestError`` or
    ``ModelUnavailable`` (after their own retries) from ``worker.exceptions``.
    """

    @property
    def provider(self) -> str: ...

    @property
    def name(self) -> str: ...

    async def complete(self, request: ModelRequest) -> ModelResponse: ...


class ModelWrapper:
    """A Model that hands everything to ``inner``: the base of each layer around a model.

    Use it for one concern on the way to the model (the fleet's rate limit, the trust
    boundary): a subclass overrides only ``complete`` and reaches the wrapped model as
    ``self.inner``; the provider and name stay the inner one's.
    """

    def __init__(self, inner: Model) -> None:
        self._inner = inner

    @property
    def inner(self) -> Model:
        return self._inner

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def name(self) -> str:
        return self._inner.name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self._inner.complete(request)
