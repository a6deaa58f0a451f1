"""The retry layer on its own: backoff, Retry-After, deadlines and error mapping."""

from __future__ import annotations

from collections import deque

import pytest

from worker.exceptions import (
    ContextTooLong,
    ModelAuthError,
    ModelRequestError,
    ModelUnavailable,
)
from worker.models._retry import (
    AttemptFailed,
    RetryPolicy,
    call_with_retries,
    error_detail,
)


class FakeTime:
    """A clock that only moves when the retry layer sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedAttempts:
    """Each call fails with the next scripted failure, then answers "ok"."""

    def __init__(self, *failures: AttemptFailed) -> None:
        self.failures = deque(failures)
        self.timeouts: list[float] = []

    async def __call__(self, timeout_s: float) -> str:
        self.timeouts.append(timeout_s)
        if self.failures:
            raise self.failures.popleft()
        return "ok"


async def run(
    attempts: ScriptedAttempts,
    policy: RetryPolicy,
    *,
    timeout_s: float | None = None,
    default_timeout_s: float = 100.0,
) -> tuple[str, int]:
    return await call_with_retries(
        attempts,
        policy=policy,
        provider="anthropic",
        model="claude-haiku-4-5",
        timeout_s=timeout_s,
        default_timeout_s=default_timeout_s,
    )


def policy(
    time: FakeTime, *, max_retries: int = 4, base_delay_s: float = 0.5, max_delay_s: float = 20.0
) -> RetryPolicy:
    return RetryPolicy(
        max_retries=max_retries,
        base_delay_s=base_delay_s,
        max_delay_s=max_delay_s,
        jitter=False,
        sleep=time.sleep,
        clock=time.clock,
    )


@pytest.mark.anyio
async def test_exponential_backoff_is_capped() -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(*(AttemptFailed("busy", status=503) for _ in range(5)))
    result, count = await run(
        attempts, policy(time, max_retries=6, base_delay_s=1.0, max_delay_s=5.0)
    )
    assert (result, count) == ("ok", 6)
    assert time.sleeps == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.anyio
async def test_full_jitter_stays_within_the_backoff_ceiling() -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(*(AttemptFailed("busy", status=500) for _ in range(4)))
    jittered = RetryPolicy(sleep=time.sleep, clock=time.clock, base_delay_s=1.0, max_delay_s=3.0)
    await run(attempts, jittered)
    ceilings = [1.0, 2.0, 3.0, 3.0]
    assert all(
        0.0 <= slept <= ceiling for slept, ceiling in zip(time.sleeps, ceilings, strict=True)
    )


@pytest.mark.anyio
async def test_retry_after_wins_over_backoff() -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(AttemptFailed("slow down", status=429, retry_after_s=3.5))
    await run(attempts, policy(time))
    assert time.sleeps == [3.5]


@pytest.mark.anyio
async def test_never_sleeps_past_the_remaining_budget() -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(*(AttemptFailed("down", status=502) for _ in range(10)))
    with pytest.raises(ModelUnavailable) as caught:
        await run(attempts, policy(time, max_retries=10), timeout_s=3.0, default_timeout_s=2.0)
    # Slept 0.5 and 1.0; the next wait of 2.0 would pass the 1.5 s left.
    assert time.sleeps == [0.5, 1.0]
    assert attempts.timeouts == [2.0, 2.0, 1.5]  # min(remaining, default) per attempt
    assert "3 attempts" in caught.value.message
    assert "remaining budget" in caught.value.message


@pytest.mark.anyio
async def test_provider_pause_longer_than_the_cap_hands_the_task_back() -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(AttemptFailed("quota", status=429, retry_after_s=120.0))
    with pytest.raises(ModelUnavailable) as caught:
        await run(attempts, policy(time, max_delay_s=20.0))
    assert time.sleeps == []
    assert caught.value.retry_after_s == 120.0


@pytest.mark.anyio
async def test_retries_exhausted_keeps_the_last_hint() -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(
        AttemptFailed("busy", status=529, retry_after_s=1.0),
        AttemptFailed("busy", status=503, retry_after_s=2.0),
        AttemptFailed("connection reset", status=None),
    )
    with pytest.raises(ModelUnavailable) as caught:
        await run(attempts, policy(time, max_retries=2))
    assert caught.value.retry_after_s == 2.0
    assert (caught.value.provider, caught.value.model) == ("anthropic", "claude-haiku-4-5")
    assert len(attempts.timeouts) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("status", [None, 408, 409, 429, 500, 502, 503, 504, 529])
async def test_transient_failures_are_retried(status: int | None) -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(AttemptFailed("transient", status=status))
    assert await run(attempts, policy(time)) == ("ok", 2)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, ModelAuthError),
        (403, ModelAuthError),
        (400, ModelRequestError),
        (404, ModelRequestError),
        (422, ModelRequestError),
        (501, ModelRequestError),
        (505, ModelRequestError),
    ],
)
async def test_permanent_failures_are_not_retried(status: int, error: type[Exception]) -> None:
    time = FakeTime()
    attempts = ScriptedAttempts(AttemptFailed("no", status=status))
    with pytest.raises(error, match=rf"anthropic model 'claude-haiku-4-5'.*HTTP {status}"):
        await run(attempts, policy(time))
    assert len(attempts.timeouts) == 1
    assert time.sleeps == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("detail", "prompt_tokens"),
    [
        (
            "request (4617 tokens) exceeds the available context size (4096 tokens), "
            "try increasing it",
            4617,
        ),
        (
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130021 tokens. Please reduce the length of the messages.",
            130021,
        ),
        ("prompt is too long: 210000 tokens > 200000 maximum", 210000),
        ("maximum context length exceeded", None),
    ],
)
async def test_a_prompt_longer_than_the_window_is_told_apart_with_its_size(
    detail: str, prompt_tokens: int | None
) -> None:
    attempts = ScriptedAttempts(AttemptFailed(detail, status=400))
    with pytest.raises(ContextTooLong) as refused:
        await run(attempts, policy(FakeTime()))
    assert refused.value.prompt_tokens == prompt_tokens
    assert len(attempts.timeouts) == 1


def test_error_detail_is_short_and_secret_free() -> None:
    key = "sk-ant-api03-abcdefghijklmnop"
    body = {"type": "error", "error": {"type": "x", "message": f"bad key {key} and sk-abc***xyz"}}
    detail = error_detail(body, "fallback", secret=key)
    assert key not in detail
    assert "sk-abc" not in detail
    assert detail.startswith("bad key")
    assert error_detail(None, "x" * 1000, secret=key).endswith("…")
    assert len(error_detail(None, "x" * 1000, secret=key)) == 300
