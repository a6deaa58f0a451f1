"""The fleet-wide limiter: token buckets and holds shared through Redis."""

from __future__ import annotations

import time

import fakeredis
import pytest

from tests.support.fake_redis import FakeRedisClients
from worker.exceptions import ModelUnavailable
from worker.models import FleetLimiter, Message, ModelRequest, ModelResponse, RateLimits, Usage
from worker.models._limiter import RateLimitedModel
from worker.models._retry import RetryingModel
from worker.models._scripted import ScriptedModel, Turn

pytestmark = pytest.mark.anyio


def request(timeout_s: float = 5.0) -> ModelRequest:
    return ModelRequest(
        system="s", messages=[Message(role="user", content="hi")], timeout_s=timeout_s
    )


async def test_requests_per_minute_are_shared_by_every_limiter_on_the_same_redis(
    redis: fakeredis.FakeRedis,
) -> None:
    limits = RateLimits(requests_per_minute=2)
    first = FleetLimiter(redis, "openai", "m", limits)
    second = FleetLimiter(redis, "openai", "m", limits)  # another worker
    deadline = time.monotonic() + 0.2
    await first.acquire(1, deadline=deadline)
    await second.acquire(1, deadline=deadline)
    with pytest.raises(ModelUnavailable, match="leaves no room before the task's deadline"):
        await first.acquire(1, deadline=deadline)  # the third call must wait ~30 s


async def test_other_models_have_their_own_buckets(redis: fakeredis.FakeRedis) -> None:
    limits = RateLimits(requests_per_minute=1)
    await FleetLimiter(redis, "openai", "a", limits).acquire(1, deadline=time.monotonic() + 1)
    await FleetLimiter(redis, "openai", "b", limits).acquire(1, deadline=time.monotonic() + 1)


async def test_tokens_per_minute_limit_counts_the_estimate(redis: fakeredis.FakeRedis) -> None:
    limiter = FleetLimiter(redis, "openai", "m", RateLimits(tokens_per_minute=1000))
    await limiter.acquire(900, deadline=time.monotonic() + 0.2)
    with pytest.raises(ModelUnavailable):
        await limiter.acquire(900, deadline=time.monotonic() + 0.2)


async def test_a_providers_retry_after_holds_the_whole_fleet(redis: fakeredis.FakeRedis) -> None:
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


async def test_unlimited_limiter_passes_calls_through(fake_redis: FakeRedisClients) -> None:
    model = RateLimitedModel(
        ScriptedModel([Turn(text="ok")]),
        FleetLimiter(fake_redis(), "openai", "m", RateLimits()),
    )
    assert (await model.complete(request())).text == "ok"


# --- reconciling estimates with actual usage ----------------------------------------------


class OneAnswerModel(RetryingModel):
    """A provider model whose one request answers with fixed usage (no network)."""

    provider_name = "openai"

    def __init__(self, usage: Usage) -> None:
        super().__init__("m", default_timeout_s=5.0, retry=None, prices=None)
        self._answer_usage = usage

    async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
        return ModelResponse(text="ok", usage=self._answer_usage, provider="openai", model="m")


def tokens_left(redis: fakeredis.FakeRedis) -> float:
    return float(redis.hget("agent-worker:limiter:openai:m:tokens", "tokens") or 0)


async def test_an_overestimate_is_refunded_after_the_call(redis: fakeredis.FakeRedis) -> None:
    limiter = FleetLimiter(redis, "openai", "m", RateLimits(tokens_per_minute=1000))
    await limiter.acquire(900, deadline=time.monotonic() + 0.2)
    limiter.settle(900, 100)
    assert tokens_left(redis) == pytest.approx(900, abs=5)  # 100 used, not 900
    await limiter.acquire(800, deadline=time.monotonic() + 0.2)  # room again at once


async def test_an_underestimate_is_charged_on_top_and_later_calls_wait(
    redis: fakeredis.FakeRedis,
) -> None:
    limiter = FleetLimiter(redis, "openai", "m", RateLimits(tokens_per_minute=1000))
    await limiter.acquire(100, deadline=time.monotonic() + 0.2)
    limiter.settle(100, 1500)  # the call really used 1,500 tokens: the bucket owes 500
    assert tokens_left(redis) == pytest.approx(-500, abs=5)
    with pytest.raises(ModelUnavailable, match="no room"):
        await limiter.acquire(10, deadline=time.monotonic() + 0.2)


async def test_a_limited_model_settles_each_call_with_its_reported_usage(
    redis: fakeredis.FakeRedis,
) -> None:
    limits = RateLimits(tokens_per_minute=1000)
    model = RateLimitedModel(
        ScriptedModel([Turn(text="ok", input_tokens=30, output_tokens=20)], name="m"),
        FleetLimiter(redis, "openai", "m", limits),
    )
    big = request()
    big.max_output_tokens = 900  # charged ~900 before the call
    await model.complete(big)
    assert tokens_left(redis) == pytest.approx(950, abs=5)


async def test_every_answered_attempt_of_a_provider_model_is_settled(
    redis: fakeredis.FakeRedis,
) -> None:
    limiter = FleetLimiter(redis, "openai", "m", RateLimits(tokens_per_minute=1000))
    model = RateLimitedModel(OneAnswerModel(Usage(input_tokens=40, output_tokens=60)), limiter)
    big = request()
    big.max_output_tokens = 800
    await model.complete(big)
    assert tokens_left(redis) == pytest.approx(900, abs=5)
