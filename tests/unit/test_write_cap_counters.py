"""Write caps with fakeredis: daily caps per UTC day, the per-post guard, the interval."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest

from worker.hub_writes import (
    CappedToolbox,
    RefusalReason,
    WriteCaps,
    WriteKind,
    WriteLedger,
    WriteRefused,
    counted_refusals,
)
from worker.hub_writes._write_caps import Reservation
from worker.metrics import JobMetrics
from worker.models import ToolSpec
from worker.redis_io import keys as redis_keys
from worker.tools import CallContext, Granted, ToolResult
from worker.tools._base import Resolution

# Today: Redis expires the day's counters by the real clock.
NOON = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
TODAY = NOON.strftime("%Y-%m-%d")


class Clock:
    def __init__(self, now: datetime = NOON) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class RecordingToolbox:
    """Answers every call with ``answer``; keeps the names it was called with."""

    def __init__(self, answer: ToolResult) -> None:
        self.answer = answer
        self.calls: list[str] = []

    def offered(self) -> Sequence[ToolSpec]:
        return []

    def resolve(self, name: str) -> Resolution:
        spec = ToolSpec(name=name, description="", input_schema={"type": "object"})
        return Granted(spec=spec, server=name.partition("__")[0])

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        self.calls.append(name)
        return self.answer


def ledger(
    redis: fakeredis.FakeRedis, task_id: str = "t-1", clock: Clock | None = None, **caps: Any
) -> WriteLedger:
    return WriteLedger(
        redis, agent_id="a", task_id=task_id, caps=WriteCaps(**caps), clock=clock or Clock()
    )


def ctx(step: int = 1) -> CallContext:
    return CallContext(task_id="t-1", agent_id="a", step=step, index=0, timeout_s=5)


def test_the_daily_cap_is_shared_by_every_task_of_the_agent_and_counts_kinds_apart(
    redis: fakeredis.FakeRedis,
) -> None:
    first, second = (
        ledger(redis, "t-1", max_daily_comments=2),
        ledger(redis, "t-2", max_daily_comments=2, max_daily_posts=0),
    )

    assert isinstance(first.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)
    assert isinstance(second.reserve(WriteKind.COMMENT, post_id="p-2"), Reservation)
    refused = first.reserve(WriteKind.COMMENT, post_id="p-3")
    post = second.reserve(WriteKind.POST)

    assert isinstance(refused, WriteRefused)
    assert refused.reason is RefusalReason.DAILY_LIMIT
    assert refused.message == "daily comment limit (2) reached"
    assert isinstance(post, WriteRefused)
    assert post.message == "daily post limit (0) reached"
    assert int(redis.get(redis_keys.daily_writes("a", "comment", TODAY))) == 2


def test_counters_expire_after_the_day_ends_and_the_next_day_starts_afresh(
    redis: fakeredis.FakeRedis,
) -> None:
    clock = Clock(NOON)
    capped = ledger(redis, clock=clock, max_daily_posts=1)
    assert isinstance(capped.reserve(WriteKind.POST), Reservation)
    assert isinstance(capped.reserve(WriteKind.POST), WriteRefused)

    expires_at = redis.expiretime(redis_keys.daily_writes("a", "post", TODAY))
    midnight = (NOON.replace(hour=0) + timedelta(days=1)).timestamp()
    assert midnight < expires_at <= midnight + 3600
    clock.now = NOON + timedelta(days=1)
    assert isinstance(capped.reserve(WriteKind.POST), Reservation)


def test_one_task_comments_once_per_post_but_other_posts_and_tasks_are_free(
    redis: fakeredis.FakeRedis,
) -> None:
    task = ledger(redis, "t-1", max_writes_per_post=1)
    other_task = ledger(redis, "t-2", max_writes_per_post=1)

    assert isinstance(task.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)
    again = task.reserve(WriteKind.COMMENT, post_id="p-1")
    assert isinstance(again, WriteRefused)
    assert again.reason is RefusalReason.PER_POST
    assert "already commented on post p-1" in again.message
    assert isinstance(task.reserve(WriteKind.COMMENT, post_id="p-2"), Reservation)
    assert isinstance(other_task.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)


def test_a_post_id_that_is_not_a_string_names_no_post_but_the_comment_still_counts(
    redis: fakeredis.FakeRedis,
) -> None:
    # A model's argument may be anything: a number, a list. None of them names a post.
    task = ledger(redis, max_daily_comments=2)

    for odd in (42, ["p-1"]):
        reservation = task.reserve(WriteKind.COMMENT, post_id=odd)
        assert isinstance(reservation, Reservation)
        assert reservation.post_id == ""
    third = task.reserve(WriteKind.COMMENT, post_id="p-1")
    assert isinstance(third, WriteRefused)
    assert third.reason is RefusalReason.DAILY_LIMIT


def test_the_same_write_made_again_by_a_re_run_counts_once(redis: fakeredis.FakeRedis) -> None:
    # A run handed back after it reserved its reply, but before it posted it: the next run
    # of the task posts the same reply (same idempotency key), and must not be refused.
    first_run = ledger(redis, "t-1", max_writes_per_post=1, max_daily_comments=5)
    next_run = ledger(redis, "t-1", max_writes_per_post=1, max_daily_comments=5)
    reply = {"post_id": "p-1", "key": "t-1:reply"}

    assert isinstance(first_run.reserve(WriteKind.COMMENT, **reply), Reservation)
    assert isinstance(next_run.reserve(WriteKind.COMMENT, **reply), Reservation)

    assert redis.hget(redis_keys.task_post_writes("t-1"), "p-1") == b"1"
    assert redis.get(redis_keys.daily_writes("a", "comment", TODAY)) == b"1"
    other = next_run.reserve(WriteKind.COMMENT, post_id="p-1", key="t-1:tool:2:0")
    assert isinstance(other, WriteRefused)
    assert other.reason is RefusalReason.PER_POST


def test_responses_per_thread_are_counted_across_tasks_and_agents_apart(
    redis: fakeredis.FakeRedis,
) -> None:
    first, second = (ledger(redis, "t-1", max_responses_per_thread=2) for _ in range(2))
    other_agent = WriteLedger(
        redis, agent_id="b", task_id="t-3", caps=WriteCaps(max_responses_per_thread=2)
    )

    assert isinstance(first.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)
    assert isinstance(second.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)
    third = ledger(redis, "t-2", max_responses_per_thread=2).reserve(
        WriteKind.COMMENT, post_id="p-1"
    )

    assert isinstance(third, WriteRefused)
    assert third.reason is RefusalReason.PER_THREAD
    assert third.message == (
        "you already answered 2 time(s) on the thread of post p-1 "
        "(max_responses_per_thread 2); do not comment on it again"
    )
    assert isinstance(first.reserve(WriteKind.COMMENT, post_id="p-2"), Reservation)
    assert isinstance(other_agent.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)
    assert isinstance(first.reserve(WriteKind.POST), Reservation)  # a new post is no response
    assert int(redis.get(redis_keys.thread_writes("a", "p-1"))) == 2
    assert redis.ttl(redis_keys.thread_writes("a", "p-1")) > 86_400


def test_no_per_thread_cap_and_a_refund_on_the_thread(redis: fakeredis.FakeRedis) -> None:
    uncapped = ledger(redis, "t-1")
    for _ in range(5):
        assert isinstance(uncapped.reserve(WriteKind.COMMENT, post_id="p-9"), Reservation)
    capped = ledger(redis, "t-2", max_responses_per_thread=1)
    reservation = capped.reserve(WriteKind.COMMENT, post_id="p-1")
    assert isinstance(reservation, Reservation)
    capped.refund(reservation)
    assert isinstance(capped.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)
    assert isinstance(capped.reserve(WriteKind.COMMENT, post_id="p-1"), WriteRefused)


def test_a_refund_gives_the_write_back(redis: fakeredis.FakeRedis) -> None:
    capped = ledger(redis, max_daily_comments=1, max_writes_per_post=1)
    reservation = capped.reserve(WriteKind.COMMENT, post_id="p-1")
    assert isinstance(reservation, Reservation)
    capped.refund(reservation)
    assert isinstance(capped.reserve(WriteKind.COMMENT, post_id="p-1"), Reservation)


def test_the_minimum_interval_holds_tool_writes_but_not_the_tasks_own_answer(
    redis: fakeredis.FakeRedis,
) -> None:
    capped = ledger(redis, min_interval_s=120)
    assert isinstance(capped.reserve(WriteKind.POST), Reservation)
    waiting = capped.reserve(WriteKind.COMMENT, post_id="p-1")
    assert isinstance(waiting, WriteRefused)
    assert waiting.reason is RefusalReason.INTERVAL
    assert "min_interval_seconds 120" in waiting.message
    answer = capped.reserve(WriteKind.COMMENT, post_id="p-1", wait_interval=False)
    assert isinstance(answer, Reservation)


@pytest.mark.anyio
async def test_capped_toolbox_refuses_hub_writes_over_the_cap_without_calling_the_tool(
    redis: fakeredis.FakeRedis,
) -> None:
    inner = RecordingToolbox(ToolResult(content="Created comment c-1 on post p-1."))
    metrics = JobMetrics()
    toolbox = CappedToolbox(
        inner,
        ledger(redis, max_daily_comments=1),
        hub_server="hub",
        on_refused=counted_refusals(agent_id="a", task_id="t-1", metrics=metrics),
    )

    first = await toolbox.call("hub__create_comment", {"post_id": "p-1", "content": "x"}, ctx())
    second = await toolbox.call("hub__create_comment", {"post_id": "p-2", "content": "y"}, ctx(2))
    # Not our hub server, or not a write: never counted.
    await toolbox.call("web__create_comment", {"post_id": "p-3"}, ctx(3))
    await toolbox.call("hub__search_posts", {"query": "x"}, ctx(4))

    assert not first.is_error
    assert second == ToolResult(
        content="Error: daily comment limit (1) reached", is_error=True, refused=True
    )
    assert inner.calls == ["hub__create_comment", "web__create_comment", "hub__search_posts"]
    batch = metrics._take()
    assert batch is not None
    assert ["agent_hub_writes_refused_total", ["a", "comment", "daily_limit"], 1] in batch[
        "counters"
    ]


@pytest.mark.anyio
async def test_a_write_the_hub_refused_does_not_count(redis: fakeredis.FakeRedis) -> None:
    inner = RecordingToolbox(ToolResult(content="Error: the Hub refused", is_error=True))
    toolbox = CappedToolbox(
        inner,
        ledger(redis, max_daily_posts=1),
        hub_server="hub",
        on_refused=counted_refusals(agent_id="a", task_id="t-1", metrics=JobMetrics()),
    )
    for step in range(3):
        await toolbox.call("hub__create_post", {"content": "x"}, ctx(step))

    assert inner.calls == ["hub__create_post"] * 3
