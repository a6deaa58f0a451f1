"""A fleet-wide limit on model calls per provider and model, shared through Redis.

Every worker takes from the same token buckets (requests per minute, tokens
per minute) before it calls a model, and a provider's ``Retry-After`` puts the
whole fleet on hold for that model, not just the worker that was told.

A call is charged an estimate of its tokens before it is sent (the real count
is known only after) and settled once answered: the difference to the usage the
provider reported is refunded, or charged on top, possibly into debt that
later takers wait out. A request that fails keeps its estimate: the provider
may have counted it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
from redis import Redis
from redis.exceptions import RedisError

from worker._tokens import tokens_of
from worker.exceptions import ModelUnavailable
from worker.logs import log_event
from worker.models._types import Model, ModelRequest, ModelResponse, ModelWrapper, Usage
from worker.redis_io import keys as redis_keys

# Token bucket: refill by elapsed time, take `cost` if there is enough, else say how long to
# wait. Returns the wait in milliseconds (0 = taken). Also honours a fleet-wide hold.
_TAKE = """
local now = tonumber(ARGV[1])
local hold = tonumber(redis.call('GET', KEYS[2]) or '0')
if hold > now then return hold - now end
local capacity = tonumber(ARGV[2])
local per_ms = capacity / 60000.0
local cost = math.min(tonumber(ARGV[3]), capacity)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - at) * per_ms)
if tokens >= cost then
  redis.call('HSET', KEYS[1], 'tokens', tokens - cost, 'at', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
  return 0
end
return math.ceil((cost - tokens) / per_ms)
"""
# Settle a charge: refill by elapsed time, then take ARGV[3] more tokens (a negative
# number refunds). The bucket may go into debt; it lives until it has refilled.
_SETTLE = """
local now = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local per_ms = capacity / 60000.0
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, math.min(capacity, tokens + (now - at) * per_ms) - tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / per_ms) + 60000)
return tostring(tokens)
"""


@dataclass(slots=True, kw_only=True, frozen=True)
class RateLimits:
    requests_per_minute: int = 0  # 0: no limit
    tokens_per_minute: int = 0

    @property
    def active(self) -> bool:
        return self.requests_per_minute > 0 or self.tokens_per_minute > 0


class FleetLimiter:
    def __init__(self, redis: Redis, provider: str, model: str, limits: RateLimits) -> None:
        self._redis = redis
        base = redis_keys.limiter(provider, model)
        self._requests_key = base + ":requests"
        self._tokens_key = base + ":tokens"
        self._hold_key = base + ":hold"
        self._limits = limits
        self._script = redis.register_script(_TAKE)
        self._settle_script = redis.register_script(_SETTLE)

    async def acquire(self, estimated_tokens: int, *, deadline: float) -> None:
        """Wait for room in both buckets (and any fleet-wide hold); never past ``deadline``."""
        buckets = [
            (self._requests_key, self._limits.requests_per_minute, 1),
            (self._tokens_key, self._limits.tokens_per_minute, estimated_tokens),
        ]
        if not self._limits.active:
            # Only the fleet-wide hold applies: one read of it, not one per bucket.
            buckets = buckets[:1]
        for key, capacity, cost in buckets:
            while True:
                wait_ms = int(self._take(key, capacity, cost))
                if wait_ms <= 0:
                    break
                if time.monotonic() + wait_ms / 1000 > deadline:
                    raise ModelUnavailable(
                        f"fleet rate limit for {key.rsplit(':', 3)[-3]} leaves no room before "
                        "the task's deadline",
                        retry_after_s=wait_ms / 1000,
                    )
                await anyio.sleep(min(wait_ms / 1000, 5.0))

    def _take(self, key: str, capacity: int, cost: int) -> int:
        now_ms = int(time.time() * 1000)
        if capacity <= 0:
            # Unlimited bucket: only the fleet-wide hold applies.
            hold = self._redis.get(self._hold_key)
            return max(0, int(hold or 0) - now_ms)
        return int(self._script(keys=[key, self._hold_key], args=[now_ms, capacity, cost]))

    def settle(self, charged_tokens: int, actual_tokens: int) -> None:
        """Correct a call's charge to the tokens it really used (refund or charge more)."""
        capacity = self._limits.tokens_per_minute
        if capacity <= 0:
            return
        difference = actual_tokens - min(charged_tokens, capacity)  # _TAKE caps a charge
        if difference == 0:
            return
        now_ms = int(time.time() * 1000)
        try:
            self._settle_script(keys=[self._tokens_key], args=[now_ms, capacity, difference])
        except RedisError as exc:
            # The call is answered; a missed correction only skews the bucket for a minute.
            log_event("limiter_settle_failed", "warning", key=self._tokens_key, error=str(exc))

    def hold(self, seconds: float) -> None:
        """Tell every worker to leave this model alone for ``seconds`` (a provider's hint)."""
        until = int((time.time() + seconds) * 1000)
        self._redis.set(self._hold_key, until, px=int(seconds * 1000) + 1000)

    def for_model(self, provider: str, model: str) -> FleetLimiter:
        """The same limits on another model's buckets (a fallback's)."""
        return FleetLimiter(self._redis, provider, model, self._limits)

    # -- AttemptGate: the retry layer asks before each single request ------------------------

    async def before_attempt(self, request: ModelRequest, timeout_s: float) -> None:
        await self.acquire(_estimate_tokens(request), deadline=time.monotonic() + timeout_s)

    def on_retry_after(self, seconds: float) -> None:
        self.hold(seconds)
        log_event("fleet_hold", "warning", key=self._hold_key, seconds=seconds)

    def after_attempt(self, request: ModelRequest, usage: Usage) -> None:
        self.settle(_estimate_tokens(request), usage.total_tokens)


class RateLimitedModel(ModelWrapper):
    """A model built outside ``create_model`` behind the fleet limiter, per ``complete`` call.

    Provider models do not need it: ``create_model(..., rate_limiter=...)`` makes the
    limiter the attempt gate of each model it builds, which also limits their retries.
    """

    def __init__(self, inner: Model, limiter: FleetLimiter) -> None:
        super().__init__(inner)
        self._limiter = limiter

    async def complete(self, request: ModelRequest) -> ModelResponse:
        budget = request.timeout_s if request.timeout_s is not None else 120.0
        deadline = time.monotonic() + budget
        charged = _estimate_tokens(request)
        await self._limiter.acquire(charged, deadline=deadline)
        remaining = max(0.001, deadline - time.monotonic())
        request.timeout_s = remaining
        try:
            response = await self._inner.complete(request)
        except ModelUnavailable as exc:
            if exc.retry_after_s:
                self._limiter.hold(exc.retry_after_s)
                log_event(
                    "fleet_hold",
                    "warning",
                    provider=self.provider,
                    model=self.name,
                    seconds=exc.retry_after_s,
                )
            raise
        self._limiter.settle(charged, response.usage.total_tokens)
        return response


def _estimate_tokens(request: ModelRequest) -> int:
    # The worker's one estimate (``worker._tokens``): cheap, stable, settled after the call.
    chars = len(request.full_system()) + sum(len(m.content) for m in request.messages)
    return max(1, tokens_of(chars)) + (request.max_output_tokens or 0)
