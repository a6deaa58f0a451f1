"""What the next model call may spend, decided before it is made.

A call's tokens are its input (known before the call, up to tokenisation) plus
its output (bounded by the ``max_output_tokens`` we send). So the loop
estimates the input from the request's characters, on the safe side, and gives
the call only the output the token and cost limits still leave. With a provider
that honours ``max_output_tokens`` and an estimate at or above the real input,
no call can carry the run past a limit.

The estimate starts at ``chars / 3.5`` plus a margin and calibrates itself on
the input tokens the provider reports for each call (tokens per character,
the highest seen in the run), so dense text (code, JSON, non-Latin scripts)
is learnt after one call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from worker._tokens import CHARS_PER_TOKEN
from worker.loop._limits import Limit, LimitReached, RunLimits
from worker.models import Message, ModelPrice, ToolSpec, Usage

SAFETY_MARGIN = 0.15
# Role markers and message framing the provider adds around each message.
TOKENS_PER_MESSAGE = 4
# Sent when the agent sets no brain.max_tokens (the providers' usual default answer size).
DEFAULT_MAX_OUTPUT_TOKENS = 4096
# Below this a step could not even write a tool call; a closing answer needs less.
MIN_STEP_OUTPUT_TOKENS = 128
MIN_CLOSING_OUTPUT_TOKENS = 32
_PER_MILLION = 1_000_000


@dataclass(slots=True, kw_only=True, frozen=True)
class CallPlan:
    """The budget of one call: its output cap and what it is expected to cost at most."""

    max_output_tokens: int
    input_tokens: int
    input_chars: int


class ConversationChars:
    """The characters of a run's conversation, counted as messages are added.

    Only messages added since the last count are read, so the count per call stays flat
    however long the conversation grows. A message shortened in place (the compactor's and
    the window fit's cuts) must be reported with ``changed``; another list, or a shorter
    one, is counted afresh.
    """

    __slots__ = ("_chars", "_counted", "_messages")

    def __init__(self) -> None:
        self._messages: Sequence[Message] | None = None
        self._counted: list[int] = []  # per message counted: its characters
        self._chars = 0

    def of(self, messages: Sequence[Message]) -> int:
        counted = self._counted
        if messages is not self._messages or len(messages) < len(counted):
            self._messages, counted, self._chars = messages, [], 0
            self._counted = counted
        for index in range(len(counted), len(messages)):
            chars = message_chars(messages[index])
            counted.append(chars)
            self._chars += chars
        return self._chars

    def changed(self, messages: Sequence[Message], index: int) -> None:
        """Message ``index`` of ``messages`` was changed in place: count it again."""
        if messages is self._messages and index < len(self._counted):
            chars = message_chars(messages[index])
            self._chars += chars - self._counted[index]
            self._counted[index] = chars


def message_chars(message: Message) -> int:
    chars = len(message.content)
    for call in message.tool_calls:
        chars += len(call.name) + len(call.arguments)
    return chars


@dataclass(slots=True)
class InputEstimator:
    """Input tokens of a request from its size, calibrated by the provider's usage reports."""

    chars_per_token: float = CHARS_PER_TOKEN
    safety_margin: float = SAFETY_MARGIN
    _tokens_per_char: float = field(init=False, default=0.0)
    # The JSON of an offered tool list, by tool names: offered tools rarely change.
    _tool_chars: dict[tuple[str, ...], int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._tokens_per_char = 1 / self.chars_per_token

    # The conversation counted so far (the run's: one estimator per run).
    _conversation: ConversationChars = field(init=False, default_factory=ConversationChars)

    def request_chars(
        self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> int:
        """Characters of a request; ``messages`` as ``ConversationChars`` counts them (a
        message changed in place is reported with ``message_changed``)."""
        return len(system) + self._chars_of_tools(tools) + self._conversation.of(messages)

    def message_changed(self, messages: Sequence[Message], index: int) -> None:
        self._conversation.changed(messages, index)

    def estimate(self, chars: int, messages: int) -> int:
        """Input tokens of a request of ``chars`` characters in ``messages`` messages."""
        tokens = chars * self._tokens_per_char * (1 + self.safety_margin)
        return math.ceil(tokens) + TOKENS_PER_MESSAGE * (messages + 1)

    def chars_per_token_now(self) -> float:
        """Characters the estimate counts as one token, margin included."""
        return 1 / (self._tokens_per_char * (1 + self.safety_margin))

    def observe(self, chars: int, input_tokens: int) -> None:
        """Learn from a call's reported input; the estimate only ever grows."""
        if chars > 0 and input_tokens > 0:
            self._tokens_per_char = max(self._tokens_per_char, input_tokens / chars)

    def _chars_of_tools(self, tools: Sequence[ToolSpec]) -> int:
        names = tuple(tool.name for tool in tools)
        known = self._tool_chars.get(names)
        if known is None:
            known = sum(
                len(tool.name) + len(tool.description) + len(json.dumps(tool.input_schema))
                for tool in tools
            )
            self._tool_chars[names] = known
        return known


def plan_call(
    limits: RunLimits,
    spent: Usage,
    *,
    input_tokens: int,
    input_chars: int,
    wanted_output_tokens: int,
    minimum_output_tokens: int,
    price: ModelPrice | None,
    last_call: Usage | None = None,
) -> CallPlan:
    """The output a call may use within the token and cost limits; LimitReached if too little.

    ``price`` is the model's (for a fallback chain, the dearest member's). Without
    one, a cost budget can only assume the next call costs what the last one did.
    """
    minimum = min(minimum_output_tokens, wanted_output_tokens)
    token_room = limits.max_tokens - spent.total_tokens - input_tokens
    cost_room = _output_tokens_affordable(limits, spent, input_tokens, price)
    output = min(wanted_output_tokens, token_room, cost_room)
    if output < minimum:
        if token_room <= cost_room:
            limits.check_tokens(spent.total_tokens, input_tokens + minimum)
        limits.check_cost(spent.cost_usd, _call_cost(price, input_tokens, minimum) or 0.0)
        raise LimitReached(  # rounding left less than a minimal answer
            f"max_cost_usd reached: the next call could write only {max(output, 0)} tokens",
            limit=Limit.BUDGET,
        )
    if price is None:
        # The provider prices calls the loop cannot: estimate the next by the last.
        limits.check_cost(spent.cost_usd, (last_call.cost_usd or 0.0) if last_call else 0.0)
    return CallPlan(max_output_tokens=output, input_tokens=input_tokens, input_chars=input_chars)


def _output_tokens_affordable(
    limits: RunLimits, spent: Usage, input_tokens: int, price: ModelPrice | None
) -> int:
    if limits.max_cost_usd is None or spent.cost_usd is None or price is None:
        return _UNBOUNDED
    left_usd = limits.max_cost_usd - spent.cost_usd - (_call_cost(price, input_tokens, 0) or 0.0)
    if price.output_per_mtok <= 0:
        return _UNBOUNDED if left_usd >= 0 else -1
    return math.floor(left_usd * _PER_MILLION / price.output_per_mtok)


def _call_cost(price: ModelPrice | None, input_tokens: int, output_tokens: int) -> float | None:
    """The most a call can cost: input at the dearest input rate (cache writes included)."""
    if price is None:
        return None
    input_rate = max(price.input_per_mtok, price.write_price, price.write_1h_price)
    return (input_tokens * input_rate + output_tokens * price.output_per_mtok) / _PER_MILLION


_UNBOUNDED = 1 << 40


def dearest_price(prices: Sequence[ModelPrice | None]) -> ModelPrice | None:
    """One price covering every model that may answer; None when any price is unknown."""
    if not prices or any(price is None for price in prices):
        return None
    known = [price for price in prices if price is not None]
    return ModelPrice(
        input_per_mtok=max(price.input_per_mtok for price in known),
        output_per_mtok=max(price.output_per_mtok for price in known),
        cache_write_per_mtok=max(price.write_price for price in known),
        cache_write_1h_per_mtok=max(price.write_1h_price for price in known),
    )
