"""The outbox on its own: every item isolated, refusals dead-lettered, dead letters replayed.

The Hub is an ``httpx2.MockTransport`` handler that answers by path, so each test
says exactly which write the Hub takes, refuses or never answers.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable

import anyio
import fakeredis
import httpx2
import pytest

from hub_client import HubClient
from tests.support.fake_redis import FakeRedisClients
from worker.hub_writes import HubWriter, OutboxItem, drain, outbox_size, park
from worker.operations._dead_letters import (
    dead_letter_count,
    drop_dead_letters,
    list_dead_letters,
    newest_dead_letter,
    replay_dead_letter,
)
from worker.redis_io import keys as redis_keys

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx2.Request], httpx2.Response]
MAINTENANCE_PAGE = "<html><body>Down for maintenance</body></html>"


def hub_answering(answers: dict[str, Handler], calls: list[str]) -> HubClient:
    """A client whose Hub answers each path prefix with its handler (201 {"id"} otherwise)."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        path = request.url.path.removeprefix("/api/v1")
        calls.append(path)
        for prefix, answer in answers.items():
            if path.startswith(prefix):
                return answer(request)
        return httpx2.Response(201, json={"id": f"new-{len(calls)}"})

    client = HubClient(
        "http://hub.test", "hub-key-0123", max_retries=0, transport=httpx2.MockTransport(handle)
    )

    async def no_sleep(_: float) -> None:
        return None

    client._sleep = no_sleep
    return client


def status(code: int, body: object = None) -> Handler:
    return lambda request: httpx2.Response(code, json=body if body is not None else {"error": "x"})


def html_page(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, text=MAINTENANCE_PAGE, headers={"content-type": "text/html"})


def refused_connection(request: httpx2.Request) -> httpx2.Response:
    raise httpx2.ConnectError("connection refused")


def comment(task_id: str, post_id: str = "p-1", attempts: int = 0) -> OutboxItem:
    return OutboxItem(
        kind="comment",
        idempotency_key=f"{task_id}:reply",
        payload={"post_id": post_id, "agent_id": "a", "content": f"answer of {task_id}"},
        attempts=attempts,
    )


def consumption(task_id: str) -> OutboxItem:
    return OutboxItem(
        kind="consumption",
        idempotency_key=f"{task_id}:consumption",
        payload={
            "agent_id": "a",
            "tokens_input": 1,
            "tokens_output": 2,
            "cost_usd": 0.0,
            "activation_id": task_id,
            "task_type": "notification",
            "duration_seconds": 1.0,
            "outcome": "completed",
        },
    )


def pending(redis: fakeredis.FakeRedis) -> dict[str, OutboxItem]:
    items = [OutboxItem.decode(raw) for raw in redis.zrange(redis_keys.OUTBOX, 0, -1)]
    return {item.idempotency_key: item for item in items}


def make_due(redis: fakeredis.FakeRedis) -> None:
    for member in redis.zrange(redis_keys.OUTBOX, 0, -1):
        redis.zadd(redis_keys.OUTBOX, {member: 0})


def events(stream: io.StringIO, name: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line["event"] == name]


# --- the writer: the one path of a task's Hub writes ---------------------------------------------


@pytest.mark.parametrize(
    ("answer", "parked", "dead"),
    [
        (status(401), 0, 1),
        (status(404), 0, 1),
        (status(422), 0, 1),
        (status(503), 1, 0),
        (status(429), 1, 0),
        (status(408), 1, 0),
        (html_page, 1, 0),
        (refused_connection, 1, 0),
        (status(201, {"no": "id"}), 1, 0),
    ],
    ids=["401", "404", "422", "503", "429", "408", "html-200", "refused", "201-no-id"],
)
async def test_the_writer_never_raises_parks_what_may_pass_later_and_buries_refusals(
    redis: fakeredis.FakeRedis, answer: Handler, parked: int, dead: int
) -> None:
    calls: list[str] = []
    buried: list[str] = []
    async with hub_answering({"/posts": answer}, calls) as hub:
        writer = HubWriter(hub, redis, task_id="t-1", on_dead_letter=buried.append)
        created = await writer.write(comment("t-1"))

    assert created is None
    assert (writer.parked, writer.dead) == (parked, dead)
    assert outbox_size(redis) == parked
    assert dead_letter_count(redis) == dead
    assert buried == ["comment"] * dead
    if parked:
        assert pending(redis)["t-1:reply"].attempts == 1  # the first try counts


async def test_a_refused_write_is_logged_and_kept_with_the_hubs_reason(
    redis: fakeredis.FakeRedis, log_stream: io.StringIO
) -> None:
    async with hub_answering({"/system/consumption": status(401, {"error": "bad key"})}, []) as hub:
        await HubWriter(hub, redis, task_id="t-1").write(consumption("t-1"))

    (line,) = events(log_stream, "outbox_dead_letter")
    assert (line["kind"], line["status"], line["idempotency_key"]) == (
        "consumption",
        401,
        "t-1:consumption",
    )
    letter = newest_dead_letter(redis)
    assert letter is not None
    assert letter.id == "t-1:consumption"
    assert letter.status == 401
    assert "bad key" in letter.error
    assert letter.payload["activation_id"] == "t-1"


# --- draining: every item on its own -------------------------------------------------------------


async def test_an_item_the_hub_never_accepts_is_dead_lettered_after_max_attempts_alone(
    redis: fakeredis.FakeRedis,
) -> None:
    # p-bad answers 201 without an id, forever; the other items are fine.
    park(redis, comment("t-bad", post_id="p-bad"), delay_s=0)
    for index in range(3):
        park(redis, consumption(f"t-{index}"), delay_s=0)
    buried: list[str] = []
    calls: list[str] = []
    async with hub_answering({"/posts/p-bad": status(201, {"no": "id"})}, calls) as hub:
        first = await drain(redis, hub, max_attempts=3, on_dead_letter=buried.append)
        assert (first.delivered, first.deferred, first.dead) == (3, 1, 0)
        assert pending(redis)["t-bad:reply"].attempts == 1
        for _ in range(2):
            make_due(redis)
            await drain(redis, hub, max_attempts=3, on_dead_letter=buried.append)

    assert outbox_size(redis) == 0
    assert buried == ["comment"]
    (letter,) = list_dead_letters(redis)
    assert (letter.id, letter.attempts) == ("t-bad:reply", 3)
    assert calls.count("/posts/p-bad/comments") == 3


async def test_a_rejected_item_does_not_stop_the_round_and_is_buried_at_once(
    redis: fakeredis.FakeRedis,
) -> None:
    park(redis, comment("t-gone", post_id="p-gone"), delay_s=0)
    park(redis, consumption("t-ok"), delay_s=0)
    async with hub_answering({"/posts/p-gone": status(404)}, []) as hub:
        result = await drain(redis, hub)

    assert (result.delivered, result.dead) == (1, 1)
    assert outbox_size(redis) == 0
    assert [letter.id for letter in list_dead_letters(redis)] == ["t-gone:reply"]


async def test_an_unreadable_outbox_member_is_buried_instead_of_aborting_the_round(
    redis: fakeredis.FakeRedis,
) -> None:
    redis.zadd(redis_keys.OUTBOX, {"not json at all": 0, '{"kind": "post"}': 0})
    park(redis, consumption("t-ok"), delay_s=0)
    calls: list[str] = []
    async with hub_answering({}, calls) as hub:
        result = await drain(redis, hub)

    assert (result.delivered, result.dead) == (1, 2)
    assert calls == ["/system/consumption"]
    assert outbox_size(redis) == 0
    assert all(letter.id.startswith("unreadable:") for letter in list_dead_letters(redis))


async def test_a_round_stops_trying_once_the_hub_is_plainly_down_without_spending_attempts(
    redis: fakeredis.FakeRedis,
) -> None:
    for index in range(6):
        park(redis, consumption(f"t-{index}"), delay_s=0)
    calls: list[str] = []
    async with hub_answering({"/": refused_connection}, calls) as hub:
        result = await drain(redis, hub)

    assert (result.deferred, result.delivered, result.dead) == (3, 0, 0)
    assert len(calls) == 3
    attempts = sorted(item.attempts for item in pending(redis).values())
    assert attempts == [0, 0, 0, 1, 1, 1]
    due_now = redis.zcount(redis_keys.OUTBOX, "-inf", time.time())
    assert due_now == 3  # the untried ones are due again at once


# --- dead letters: list, replay, drop ------------------------------------------------------------


async def bury_three(redis: fakeredis.FakeRedis) -> None:
    async with hub_answering({"/": status(422)}, []) as hub:
        writer = HubWriter(hub, redis, task_id="t")
        for task_id in ("t-1", "t-2", "t-3"):
            await writer.write(consumption(task_id))
            await anyio.sleep(0.002)  # distinct times: the order is by when each died


async def test_dead_letters_are_listed_newest_first_and_dropped_by_id(
    redis: fakeredis.FakeRedis,
) -> None:
    await bury_three(redis)
    assert [letter.id for letter in list_dead_letters(redis)] == [
        "t-3:consumption",
        "t-2:consumption",
        "t-1:consumption",
    ]
    assert drop_dead_letters(redis, ["t-2:consumption", "nope"]) == 1
    assert [letter.id for letter in list_dead_letters(redis, limit=0)] == [
        "t-3:consumption",
        "t-1:consumption",
    ]
    assert dead_letter_count(redis) == 2


async def test_replay_delivers_requeues_or_keeps_each_letter_by_what_the_hub_says(
    redis: fakeredis.FakeRedis,
) -> None:
    await bury_three(redis)
    letters = {letter.id: letter for letter in list_dead_letters(redis)}
    answers = {
        "t-1": status(201, {"ok": True}),
        "t-2": status(503),
        "t-3": status(422, {"error": "still wrong"}),
    }

    def by_task(request: httpx2.Request) -> httpx2.Response:
        task_id = json.loads(request.content)["activation_id"]
        return answers[task_id](request)

    calls: list[str] = []
    async with hub_answering({"/system/consumption": by_task}, calls) as hub:
        results = {
            key: await replay_dead_letter(redis, hub, letter, timeout_s=5)
            for key, letter in letters.items()
        }

    assert results == {
        "t-1:consumption": "delivered",
        "t-2:consumption": "requeued",
        "t-3:consumption": "rejected",
    }
    assert [letter.id for letter in list_dead_letters(redis)] == ["t-3:consumption"]
    assert "still wrong" in list_dead_letters(redis)[0].error
    requeued = pending(redis)["t-2:consumption"]
    assert requeued.attempts == 0  # a fresh start in the outbox


async def test_a_hanging_hub_cannot_hold_settling_past_the_writers_budget(
    redis: fakeredis.FakeRedis,
) -> None:
    calls: list[str] = []

    async def hang(request: httpx2.Request) -> httpx2.Response:
        calls.append(request.url.path)
        await anyio.sleep(30)
        return httpx2.Response(201, json={"id": "late"})

    hub = HubClient("http://hub.test", "hub-key-0123", transport=httpx2.MockTransport(hang))
    async with hub:
        writer = HubWriter(hub, redis, task_id="t-1", timeout_s=15, budget_s=0.3)
        for task_id in ("t-1", "t-2", "t-3"):
            assert await writer.write(consumption(task_id)) is None

    assert len(calls) == 1  # once the budget is spent, the rest are parked untried
    assert writer.parked == 3
    assert set(pending(redis)) == {"t-1:consumption", "t-2:consumption", "t-3:consumption"}


@pytest.mark.parametrize("answer", [status(503), status(422)], ids=["to-park", "to-bury"])
async def test_the_writer_says_what_is_lost_when_redis_is_down_too_but_never_raises(
    answer: Handler, log_stream: io.StringIO, fake_redis: FakeRedisClients
) -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    redis = fake_redis(server=server)
    async with hub_answering({"/": answer}, []) as hub:
        writer = HubWriter(hub, redis, task_id="t-1")
        assert await writer.write(consumption("t-1")) is None

    (lost,) = events(log_stream, "hub_write_lost")
    assert (lost["kind"], lost["idempotency_key"]) == ("consumption", "t-1:consumption")
    assert (writer.parked, writer.dead) == (0, 0)
    assert events(log_stream, "outbox_dead_letter") == []
