"""The fleet-wide limiter: token buckets and holds shared through Redis."""

from __future__ import annotations

import time

import fakeredis
import pytest

from worker.exceptions import ModelUnavailable
from worker.limiter import FleetLimiter, RateLimitedModel, RateLimits
from worker.models import Message, ModelRequest, ScriptedModel, Turn

pytestmark = pytest.mark.anyio


def request(timeout_s: float = 5.0) -> ModelRequest:
    return ModelRequest(
        system="s", messages=[Message(role="user", content="hi")], timeout_s=timeout_s
    )


async def test_requests_per_minute_are_shared_by_every_limiter_on_the_same_redis() -> None:
    redis = fakeredis.FakeRedis()
    limits = RateLimits(requests_per_minute=2)
    first = FleetLimiter(redis, "openai", "m", limits)
    second = FleetLimiter(redis, "openai", "m", limits)  # another worker
    deadline = time.monotonic() + 0.2
    await first.acquire(1, deadline=deadline)
    await second.acquire(1, deadline=deadline)
    with pytest.raises(ModelUnavailable, match="leaves no room before the task's deadline"):
        await first.acquire(1, deadline=deadline)  # the third call must wait ~30 s


async def test_other_models_have_their_own_buckets() -> None:
    redis = fakeredis.FakeRedis()
    limits = RateLimits(requests_per_minute=1)
    await FleetLimiter(redis, "openai", "a", limits).acquire(1, deadline=time.monotonic() + 1)
    await FleetLimiter(redis, "openai", "b", limits).acquire(1, deadline=time.monotonic() + 1)


async def test_tokens_per_minute_limit_counts_the_estimate() -> None:
    redis = fakeredis.FakeRedis()
    limiter = FleetLimiter(redis, "openai", "m", RateLimits(tokens_per_minute=1000))
    await limiter.acquire(900, deadline=time.monotonic() + 0.2)
    with pytest.raises(ModelUnavailable):
        await limiter.acquire(900, deadline=time.monotonic() + 0.2)


async def test_a_providers_retry_after_holds_the_whole_fleet() -> None:
    redis = fakeredis.FakeRedis()
    storm = ModelUnavailable("429", provider="openai", model="m", retry_after_s=30)
    model = RateLimitedModel(
        ScriptedModel([Turn(error=storm)], provider="openai", name="m"),
        FleetLimiter(redis, "openai", "m", RateLimits()),
    )
    with pytest.raises(ModelUnavailable):
        await model.complete(request())
    other_worker = RateLimitedModel(
        ScriptedModel([Turn(text="ok")], provider="openai", name="m"),
        FleetLimiter(redis, "openai", "m", RateLimits()),
    )
    with pytest.raises(ModelUnavailable, match="no room"):
        await other_worker.complete(request(timeout_s=1.0))


async def test_unlimited_limiter_passes_calls_through() -> None:
    model = RateLimitedModel(
        ScriptedModel([Turn(text="ok")]),
        FleetLimiter(fakeredis.FakeRedis(), "openai", "m", RateLimits()),
    )
    assert (await model.complete(request())).text == "ok"
