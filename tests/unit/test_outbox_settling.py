"""Settling through the outbox, in process: whatever the Hub or Redis does while a task closes
out, it ends with one report, its metrics and one task_completed line."""

from __future__ import annotations

import io
import json
from typing import Any

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.pipeline import Harness, notification
from worker.coordination import RedisJournal
from worker.hub_writes import outbox_size
from worker.models._scripted import Turn
from worker.operations._dead_letters import list_dead_letters
from worker.task import Outcome

pytestmark = pytest.mark.anyio


def events(stream: io.StringIO, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line["event"] == name]


def counted(harness: Harness, name: str) -> list[Any]:
    batch = harness.metrics._take()
    assert batch is not None
    return [entry for entry in batch["counters"] if entry[0] == name]


async def test_a_maintenance_page_on_every_write_parks_them_and_the_task_still_ends_once(
    log_stream: io.StringIO,
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="The answer.")], redis=redis)
    post_id = await h.seed_post()
    page = {"status": 200, "count": 1000, "method": "POST", "content_type": "text/html"}
    await h.dev("faults", {**page, "body": "<html>maintenance</html>"})

    verdict = await h.run(notification(post_id))

    assert verdict.report.outcome is Outcome.COMPLETED
    parked = {event["kind"] for event in events(log_stream, "hub_write_parked")}
    assert parked == {"comment", "consumption", "notifications_read", "activated"}
    assert outbox_size(h.redis) == 4
    assert len(events(log_stream, "task_completed")) == 1
    assert counted(h, "agent_tasks_total") == [
        ["agent_tasks_total", ["demo-agent", "notification", "completed"], 1]
    ]


async def test_rejections_while_settling_are_dead_letters_not_a_crashed_job(
    log_stream: io.StringIO,
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="The answer.")], redis=redis)
    post_id = await h.seed_post()
    await h.dev("faults", {"status": 401, "count": 1, "path_prefix": "/api/v1/system/consumption"})
    await h.dev("faults", {"status": 404, "count": 1, "path_prefix": "/api/v1/notifications/read"})

    verdict = await h.run(notification(post_id))

    assert verdict.report.outcome is Outcome.COMPLETED
    assert len(verdict.report.posted) == 1
    assert {letter.id for letter in list_dead_letters(h.redis)} == {"t-1:consumption", "t-1:read"}
    assert len(events(log_stream, "outbox_dead_letter")) == 2
    assert len(events(log_stream, "task_completed")) == 1
    dead = counted(h, "agent_outbox_dead_letters_total")
    assert sorted(entry[1][0] for entry in dead) == ["consumption", "notifications_read"]


async def test_redis_failing_at_the_end_still_ends_the_task_with_its_report(
    log_stream: io.StringIO, monkeypatch: pytest.MonkeyPatch, redis: fakeredis.FakeRedis
) -> None:
    def redis_gone(self: RedisJournal) -> None:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(RedisJournal, "clear", redis_gone)
    h = Harness([Turn(text="The answer.")], redis=redis)
    post_id = await h.seed_post()

    verdict = await h.run(notification(post_id))

    assert verdict.report.outcome is Outcome.COMPLETED
    assert len(events(log_stream, "settle_failed")) == 1
    assert len(events(log_stream, "task_completed")) == 1
    assert len((await h.state())["consumption"]) == 1
