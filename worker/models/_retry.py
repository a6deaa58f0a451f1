"""The one retry layer for LLM calls (the SDKs' own retries are off).

Layers, as in httpx: ``RetryingModel.complete`` → ``call_with_retries`` → a
provider's ``_request_once``. The single request raises ``AttemptFailed`` for
anything HTTP-shaped; ``call_with_retries`` retries what ``classify_status`` calls
transient (408/409/429, 5xx but 501/505, connection errors; docs/http-status.md) with
exponential backoff and full jitter, honours ``Retry-After``, never waits past the
caller's remaining budget, and turns the rest into the ``ModelError`` tree (401/403 →
ModelAuthError, other 4xx and 501/505 → ModelRequestError, retries spent →
ModelUnavailable carrying the provider's last pause hint).
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar

import anyio

from hub_client.retry_rules import Backoff, Failure, Jitter, classify_status
from worker import logs
from worker.exceptions import ContextTooLong, ModelAuthError, ModelRequestError, ModelUnavailable
from worker.models._prices import PriceTable
from worker.models._types import ModelRequest, ModelResponse, Usage
from worker.tracing import note_retry, traced_chat

T = TypeVar("T")

# The SDK treats a zero timeout as "fail at once"; the loop's own deadline is the real guard.
_MIN_ATTEMPT_TIMEOUT_S = 1.0
_DETAIL_MAX_CHARS = 300
# Providers echo a masked key back ("Incorrect API key provided: sk-abc***wxyz").
_KEY_SHAPE = re.compile(r"\bsk-[A-Za-z0-9_*.\-]{4,}")


@dataclass(slots=True, kw_only=True, frozen=True)
class RetryPolicy:
    """How hard to retry a provider. ``sleep`` and ``clock`` are injectable for tests."""

    max_retries: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    jitter: bool = True
    sleep: Callable[[float], Awaitable[None]] = field(
        default=anyio.sleep, repr=False, compare=False
    )
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    def backoff_s(self, retry_number: int) -> float:
        """Exponential backoff with full jitter for the n-th retry (1-based)."""
        backoff = Backoff(
            first_s=self.base_delay_s,
            max_s=self.max_delay_s,
            jitter=Jitter.FULL if self.jitter else Jitter.NONE,
        )
        return backoff.delay_s(retry_number - 1)


class AttemptFailed(Exception):
    """One request failed in an HTTP-shaped way; ``status`` is None for connection errors."""

    def __init__(
        self, detail: str, *, status: int | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def kind(self) -> Failure:
        """What the status means (docs/http-status.md); no status is a connection error."""
        return classify_status(self.status)

    @property
    def retryable(self) -> bool:
        return self.kind is Failure.TRANSIENT

    def describe(self) -> str:
        if self.status is None:
            return self.detail
        return f"HTTP {self.status}: {self.detail}"


async def call_with_retries(
    attempt: Callable[[float], Awaitable[T]],
    *,
    policy: RetryPolicy,
    provider: str,
    model: str,
    timeout_s: float | None,
    default_timeout_s: float,
) -> tuple[T, int]:
    """Run ``attempt(attempt_timeout_s)`` until it succeeds; return its result and attempts made.

    ``timeout_s`` is the caller's remaining budget (None: no deadline); each
    attempt gets ``min(remaining, default_timeout_s)``.
    """
    started = policy.clock()

    def remaining_budget() -> float | None:
        return None if timeout_s is None else timeout_s - (policy.clock() - started)

    attempts = 0
    last_hint: float | None = None
    while True:
        attempts += 1
        remaining = remaining_budget()
        attempt_timeout = (
            default_timeout_s if remaining is None else min(remaining, default_timeout_s)
        )
        try:
            return await attempt(max(attempt_timeout, _MIN_ATTEMPT_TIMEOUT_S)), attempts
        except AttemptFailed as failure:
            _raise_if_permanent(failure, provider=provider, model=model)
            if failure.retry_after_s is not None:
                last_hint = failure.retry_after_s
            delay = _next_delay(failure, policy=policy, retry_number=attempts)
            stop_reason = _stop_reason(
                delay, policy=policy, attempts=attempts, remaining=remaining_budget()
            )
            if stop_reason is not None:
                raise ModelUnavailable(
                    f"{provider} model {model!r} unavailable after {attempts} "
                    f"attempt{'s' if attempts != 1 else ''} ({stop_reason}): {failure.describe()}",
                    provider=provider,
                    model=model,
                    retry_after_s=last_hint,
                ) from failure
            note_retry(status=failure.status, delay_s=delay, attempt=attempts)
            await policy.sleep(delay)


def _raise_if_permanent(failure: AttemptFailed, *, provider: str, model: str) -> None:
    if failure.retryable:
        return
    if failure.kind is Failure.AUTH:
        raise ModelAuthError(
            f"{provider} model {model!r} rejected the credentials: {failure.describe()}",
            provider=provider,
            model=model,
        ) from failure
    message = f"{provider} model {model!r} refused the request: {failure.describe()}"
    if _CONTEXT_TOO_LONG.search(failure.detail):
        raise ContextTooLong(
            message, provider=provider, model=model, prompt_tokens=_prompt_tokens(failure.detail)
        ) from failure
    raise ModelRequestError(message, provider=provider, model=model) from failure


# How providers refuse a prompt longer than the window: llama-server "request (4617 tokens)
# exceeds the available context size (4096 tokens)", OpenAI "maximum context length is
# 128000 tokens. However, your messages resulted in 130021 tokens", Anthropic "prompt is
# too long: 210000 tokens > 200000 maximum".
_CONTEXT_TOO_LONG = re.compile(
    r"exceeds the available context size|maximum context length|context_length_exceeded"
    r"|prompt is too long",
    re.IGNORECASE,
)
_PROMPT_TOKENS = re.compile(
    r"request \((\d+) tokens\)|resulted in (\d+) tokens|too long: (\d+) tokens", re.IGNORECASE
)


def _prompt_tokens(detail: str) -> int | None:
    found = _PROMPT_TOKENS.search(detail)
    if found is None:
        return None
    return int(next(group for group in found.groups() if group is not None))


def _next_delay(failure: AttemptFailed, *, policy: RetryPolicy, retry_number: int) -> float:
    if failure.retry_after_s is not None:
        return failure.retry_after_s
    return policy.backoff_s(retry_number)


def _stop_reason(
    delay: float, *, policy: RetryPolicy, attempts: int, remaining: float | None
) -> str | None:
    if attempts > policy.max_retries:
        return "retries exhausted"
    # A provider asking for a longer pause than we would ever wait: hand the task back
    # (it is requeued with that delay) rather than hold a worker slot.
    if delay > policy.max_delay_s:
        return f"provider asked to wait {delay:g}s, more than the {policy.max_delay_s:g}s cap"
    if remaining is not None and delay >= remaining:
        return f"next wait {delay:g}s would pass the remaining budget of {max(remaining, 0):.1f}s"
    return None


def error_detail(body: object, fallback: str, *, secret: str) -> str:
    """A short, secret-free explanation from a provider's error body."""
    message: object = None
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
    text = str(message) if message else fallback
    if secret:
        text = text.replace(secret, "[REDACTED]")
    text = _KEY_SHAPE.sub("[REDACTED]", text)
    text = " ".join(text.split())
    if len(text) > _DETAIL_MAX_CHARS:
        text = text[: _DETAIL_MAX_CHARS - 1] + "…"
    return text or "no detail"


class AttemptGate(Protocol):
    """Consulted around every single request of the retry layer: the fleet-wide rate limiter.

    Gating ``complete`` as a whole would let each retry reach the provider unlimited,
    which is exactly when a 429 storm needs the fleet to slow down.
    """

    async def before_attempt(self, request: ModelRequest, timeout_s: float) -> None:
        """Wait for room to send one request (raise ModelUnavailable if none comes in time)."""

    def on_retry_after(self, seconds: float) -> None:
        """The provider asked for a pause: hold every sender, not just this one."""

    def after_attempt(self, request: ModelRequest, usage: Usage) -> None:
        """The request was answered: settle what ``before_attempt`` charged with its usage."""


class RetryingModel(ABC):
    """A provider model: ``complete`` runs one ``_request_once`` under the retry layer.

    Providers override only ``_request_once`` (one SDK call, foreign errors
    turned into ``AttemptFailed``) and name themselves in ``provider_name``.
    ``attempt_gate``, when set, is consulted before each of those requests.
    """

    provider_name: ClassVar[str]
    attempt_gate: AttemptGate | None = None

    def __init__(
        self,
        model: str,
        *,
        default_timeout_s: float,
        retry: RetryPolicy | None,
        prices: PriceTable | None,
    ) -> None:
        self._model = model
        self._default_timeout_s = default_timeout_s
        self._retry = retry or RetryPolicy()
        self._prices = prices or PriceTable.builtin()

    @property
    def provider(self) -> str:
        return self.provider_name

    @property
    def name(self) -> str:
        return self._model

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call of this model in one ``chat {model}`` span, its retries as events."""
        return await traced_chat(self, request, lambda: self._complete(request))

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        async def attempt(timeout_s: float) -> ModelResponse:
            gate = self.attempt_gate
            if gate is None:
                return await self._request_once(request, timeout_s)
            waited_from = time.monotonic()
            await gate.before_attempt(request, timeout_s)
            timeout_s = max(_MIN_ATTEMPT_TIMEOUT_S, timeout_s - (time.monotonic() - waited_from))
            try:
                answered = await self._request_once(request, timeout_s)
            except AttemptFailed as failure:
                if failure.retry_after_s:
                    gate.on_retry_after(failure.retry_after_s)
                raise
            gate.after_attempt(request, answered.usage)
            return answered

        response, attempts = await call_with_retries(
            attempt,
            policy=self._retry,
            provider=self.provider_name,
            model=self._model,
            timeout_s=request.timeout_s,
            default_timeout_s=self._default_timeout_s,
        )
        response.attempts = attempts
        return response

    @abstractmethod
    async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
        """Send one request with this timeout; raise AttemptFailed for HTTP-shaped failures."""

    def _usage(
        self,
        answered_model: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> Usage:
        """Token counts and their cost, priced by the configured name, else by the answering one."""
        cost: float | None = None
        for priced_name in (self._model, answered_model):
            cost = self._prices.cost(
                priced_name,
                input_tokens,
                output_tokens,
                cache_read_tokens=cache_read_tokens,
                cache_write_tokens=cache_write_tokens,
                cache_write_1h_tokens=cache_write_1h_tokens,
            )
            if cost is not None:
                break
        return Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=cost,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
        )


def connection_failure(exc: BaseException) -> str:
    """What went wrong on the wire, from an SDK connection error and the error beneath it."""
    cause = exc.__cause__ or exc
    # Redacted before the cut: an SDK error may quote a URL with its credentials.
    detail = " ".join(logs.redact(str(cause)).split())[:_DETAIL_MAX_CHARS]
    name = type(cause).__name__
    return f"connection failed: {name}: {detail}" if detail else f"connection failed: {name}"
