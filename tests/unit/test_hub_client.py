"""HubClient against httpx2.MockTransport: wire format, retries, errors, secrecy."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

import anyio
import httpx2
import pytest

from hub_client import (
    BudgetHealth,
    ConsumptionRecord,
    HubAuthError,
    HubClient,
    HubError,
    HubNotFound,
    HubRejected,
    HubUnavailable,
)

API_KEY = "sk-hub-very-secret-0123"

POST_42 = {
    "id": "p-42",
    "author": {"id": "devops-agent", "name": "DevOps Agent"},
    "title": "Redis keeps restarting",
    "content": "Any idea why?",
    "community": "m/ops",
    "parent_id": None,
    "created_at": "2025-03-01T10:00:00Z",
    "score": 17,  # a field this client does not know
    "comments": [
        {
            "id": "c-1",
            "post_id": "p-42",
            "author": {"id": "helper"},
            "content": "Check the OOM killer.",
            "created_at": "2025-03-01T10:05:00Z",
        }
    ],
}

Handler = Callable[[httpx2.Request], httpx2.Response]


class Recorder:
    """Answers with a scripted sequence of responses and keeps every request."""

    def __init__(self, *answers: httpx2.Response | Handler | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx2.Response):
            return answer
        return answer(request)

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


def make_client(
    recorder: Recorder | Callable[[httpx2.Request], Any], **options: Any
) -> tuple[HubClient, list[float]]:
    client = HubClient(
        "http://hub.test", API_KEY, transport=httpx2.MockTransport(recorder), **options
    )
    sleeps: list[float] = []

    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client._sleep = record_sleep
    return client, sleeps


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(status, json=body, headers=headers)


# -- wire format --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_get_post_reads_the_thread_with_comments_and_ignores_unknown_fields() -> None:
    recorder = Recorder(answer(200, POST_42))
    client, _ = make_client(recorder)
    async with client:
        post = await client.get_post("p-42")

    request = recorder.requests[0]
    assert request.method == "GET"
    assert request.url.path == "/api/v1/posts/p-42"
    assert request.url.params["include_comments"] == "true"
    assert request.headers["Authorization"] == f"Bearer {API_KEY}"
    assert post.id == "p-42"
    assert post.author.name == "DevOps Agent"
    assert post.community == "m/ops"
    assert post.created_at is not None and post.created_at.year == 2025
    assert [comment.content for comment in post.comments] == ["Check the OOM killer."]
    # A missing author name falls back to the id, so callers can always print it.
    assert post.comments[0].author.name == "helper"


@pytest.mark.anyio
async def test_base_url_may_end_with_a_slash_or_already_name_the_api() -> None:
    for base_url in ("http://hub.test/", "http://hub.test/api/v1"):
        recorder = Recorder(answer(200, POST_42))
        client = HubClient(base_url, transport=httpx2.MockTransport(recorder))
        async with client:
            await client.get_post("p-42")
        assert recorder.requests[0].url.path == "/api/v1/posts/p-42"
        assert "Authorization" not in recorder.requests[0].headers


@pytest.mark.anyio
async def test_create_post_sends_the_idempotency_key_and_only_the_given_fields() -> None:
    created = {"id": "p-7", "created_at": "2025-03-01T10:00:00Z", "author": {"id": "a1"}}
    recorder = Recorder(answer(201, created))
    client, _ = make_client(recorder)
    async with client:
        result = await client.create_post(
            agent_id="a1", content="Hello", idempotency_key="t-1:reply"
        )

    request = recorder.requests[0]
    assert (request.method, request.url.path) == ("POST", "/api/v1/posts")
    assert request.headers["Idempotency-Key"] == "t-1:reply"
    assert recorder.body() == {"agent_id": "a1", "content": "Hello"}
    assert result.id == "p-7"
    assert result.author is not None and result.author.id == "a1"


@pytest.mark.anyio
async def test_create_comment_posts_on_the_thread_with_its_key() -> None:
    recorder = Recorder(answer(201, {"id": "c-9", "post_id": "p-42"}))
    client, _ = make_client(recorder)
    async with client:
        comment = await client.create_comment(
            "p-42", agent_id="a1", content="Looks like OOM.", idempotency_key="t-1:tool:2:0"
        )

    request = recorder.requests[0]
    assert request.url.path == "/api/v1/posts/p-42/comments"
    assert request.headers["Idempotency-Key"] == "t-1:tool:2:0"
    assert recorder.body() == {"agent_id": "a1", "content": "Looks like OOM."}
    assert comment.id == "c-9"


@pytest.mark.anyio
async def test_search_and_discover_send_their_filters_and_parse_the_lists() -> None:
    recorder = Recorder(answer(200, {"results": [POST_42]}), answer(200, {"posts": [POST_42]}))
    client, _ = make_client(recorder)
    async with client:
        found = await client.search("redis", community="m/ops", author="devops-agent", limit=5)
        feed = await client.discover_feed(
            communities=["m/ops", "m/dev"], keywords=["redis"], agent_id="a1", limit=3
        )

    search_params = recorder.requests[0].url.params
    assert recorder.requests[0].url.path == "/api/v1/search"
    assert dict(search_params) == {
        "q": "redis",
        "community": "m/ops",
        "author": "devops-agent",
        "limit": "5",
    }
    feed_params = recorder.requests[1].url.params
    assert recorder.requests[1].url.path == "/api/v1/feed/discover"
    assert feed_params["communities"] == "m/ops,m/dev"
    assert feed_params["keywords"] == "redis"
    assert feed_params["exclude_responded"] == "true"
    assert feed_params["agent_id"] == "a1"
    assert feed_params["limit"] == "3"
    assert [post.id for post in found] == ["p-42"]
    assert [post.id for post in feed] == ["p-42"]


@pytest.mark.anyio
async def test_stale_agents_asks_for_the_staleness_and_keeps_the_order() -> None:
    agents = [
        {"id": "never", "name": "Never", "last_activated_at": None},
        {"id": "old", "name": "Old", "last_activated_at": "2025-01-01T00:00:00Z"},
    ]
    recorder = Recorder(answer(200, {"agents": agents}))
    client, _ = make_client(recorder)
    async with client:
        stale = await client.stale_agents(min_staleness_s=600)

    assert recorder.requests[0].url.path == "/api/v1/agents"
    assert dict(recorder.requests[0].url.params) == {"stale": "true", "min_staleness": "600"}
    assert [agent.id for agent in stale] == ["never", "old"]
    assert stale[0].last_activated_at is None
    assert stale[1].last_activated_at is not None


@pytest.mark.anyio
async def test_report_consumption_sends_every_field_including_cost_known() -> None:
    recorder = Recorder(httpx2.Response(201))
    client, _ = make_client(recorder)
    record = ConsumptionRecord(
        agent_id="a1",
        tokens_input=1200,
        tokens_output=300,
        cost_usd=0.0,
        activation_id="t-1",
        task_type="notification",
        duration_seconds=4.5,
        outcome="completed",
        cost_known=False,
        tokens_cache_read=900,
    )
    async with client:
        await client.report_consumption(record, idempotency_key="t-1:consumption")

    assert recorder.requests[0].url.path == "/api/v1/system/consumption"
    assert recorder.requests[0].headers["Idempotency-Key"] == "t-1:consumption"
    assert recorder.body() == {
        "agent_id": "a1",
        "tokens_input": 1200,
        "tokens_output": 300,
        "cost_usd": 0.0,
        "activation_id": "t-1",
        "task_type": "notification",
        "duration_seconds": 4.5,
        "outcome": "completed",
        "cost_known": False,
        "tokens_cache_read": 900,
        "tokens_cache_write": 0,
    }


@pytest.mark.anyio
async def test_notifications_and_activation_are_posted_and_empty_reads_send_nothing() -> None:
    recorder = Recorder(answer(200, {"read": ["n-1"]}), httpx2.Response(204))
    client, _ = make_client(recorder)
    async with client:
        await client.mark_notifications_read([])
        await client.mark_notifications_read(["n-1", "n-2"])
        await client.mark_activated("devops-agent")

    assert [r.url.path for r in recorder.requests] == [
        "/api/v1/notifications/read",
        "/api/v1/agents/devops-agent/activated",
    ]
    assert recorder.body(0) == {"notification_ids": ["n-1", "n-2"]}


# -- budget health: both shapes -----------------------------------------------------------------


@pytest.mark.anyio
async def test_budget_health_simple_shape_and_its_summary_line() -> None:
    simple = {
        "daily_limit": 5.0,
        "daily_used": 1.2,
        "monthly_limit": 100.0,
        "monthly_used": 30.0,
        "healthy": True,
    }
    recorder = Recorder(answer(200, simple))
    client, _ = make_client(recorder)
    async with client:
        health = await client.budget_health("a1")

    assert recorder.requests[0].url.params["agent_id"] == "a1"
    assert health.healthy is True
    assert health.shape == "simple"
    assert health.summary() == (
        "Budget: $1.20 of $5.00 used today (24%), $30.00 of $100.00 this month."
    )


@pytest.mark.anyio
async def test_budget_health_collective_shape_reports_unhealthy() -> None:
    collective = {
        "tools": {"claude-code": {"used_usd": 98.0}},
        "collective": {
            "total_budget_usd": 100.0,
            "total_used_usd": 98.0,
            "overall_health": "critical",
        },
    }
    recorder = Recorder(answer(200, collective))
    client, _ = make_client(recorder)
    async with client:
        health = await client.budget_health("a1")

    assert health.healthy is False
    assert health.shape == "collective"
    assert health.total_used_usd == 98.0
    assert health.tools == {"claude-code": {"used_usd": 98.0}}
    assert "$98.00 of $100.00" in health.summary()
    assert "critical" in health.summary()


def test_budget_health_derives_health_when_the_hub_leaves_it_out() -> None:
    collective_ok = BudgetHealth.model_validate(
        {"collective": {"total_budget_usd": 100, "total_used_usd": 10, "overall_health": "ok"}}
    )
    collective_spent = BudgetHealth.model_validate(
        {"collective": {"total_budget_usd": 100, "total_used_usd": 100}}
    )
    simple_over = BudgetHealth.model_validate(
        {"daily_limit": 10, "daily_used": 12, "monthly_limit": 300, "monthly_used": 12}
    )
    assert collective_ok.healthy is True
    assert collective_spent.healthy is False
    assert simple_over.healthy is False


# -- retries ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_get_retries_503_then_succeeds_waiting_as_long_as_retry_after_says() -> None:
    unavailable = answer(503, {"error": "busy"}, headers={"Retry-After": "2"})
    recorder = Recorder(unavailable, unavailable, answer(200, POST_42))
    client, sleeps = make_client(recorder)
    async with client:
        post = await client.get_post("p-42")

    assert post.id == "p-42"
    assert len(recorder.requests) == 3
    assert len(sleeps) == 2
    assert all(2.0 <= pause < 3.0 for pause in sleeps)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "first",
    [
        answer(502),
        # 409: a request with the same key is still being processed.
        answer(409, {"error": "a request with this key is in progress"}),
    ],
)
async def test_a_write_with_an_idempotency_key_is_retried_with_the_same_key(
    first: httpx2.Response,
) -> None:
    recorder = Recorder(first, answer(201, {"id": "c-1"}))
    client, sleeps = make_client(recorder)
    async with client:
        created = await client.create_comment(
            "p-1", agent_id="a1", content="hi", idempotency_key="t-9:reply"
        )

    assert created.id == "c-1"
    assert [r.headers["Idempotency-Key"] for r in recorder.requests] == ["t-9:reply"] * 2
    assert len(sleeps) == 1


@pytest.mark.anyio
async def test_a_post_without_idempotency_key_is_never_retried() -> None:
    recorder = Recorder(answer(503))
    client, sleeps = make_client(recorder)
    async with client:
        with pytest.raises(HubUnavailable) as raised:
            await client._send_with_retries("POST", "/posts", json={"agent_id": "a1"})

    assert len(recorder.requests) == 1
    assert sleeps == []
    assert raised.value.status == 503


@pytest.mark.anyio
async def test_naturally_idempotent_writes_are_retried() -> None:
    recorder = Recorder(answer(503), answer(503), answer(200, {}))
    client, _ = make_client(recorder)
    async with client:
        await client.mark_notifications_read(["n-1"])
        await client.mark_activated("a1")

    assert [r.url.path for r in recorder.requests] == [
        "/api/v1/notifications/read",
        "/api/v1/notifications/read",
        "/api/v1/notifications/read",
        "/api/v1/agents/a1/activated",
    ]


@pytest.mark.anyio
async def test_persistent_5xx_becomes_hub_unavailable_naming_method_and_path() -> None:
    recorder = Recorder(answer(503))
    client, sleeps = make_client(recorder, max_retries=3)
    async with client:
        with pytest.raises(HubUnavailable) as raised:
            await client.create_comment(
                "p-42", agent_id="a1", content="x", idempotency_key="t-1:reply"
            )

    assert len(recorder.requests) == 4
    assert len(sleeps) == 3
    # Exponential: each pause is longer than the previous one's lower bound.
    assert sleeps[0] < sleeps[2]
    assert str(raised.value).startswith("POST /posts/p-42/comments: 503 Service Unavailable")
    assert raised.value.status == 503


@pytest.mark.anyio
async def test_429_after_the_retries_is_unavailable() -> None:
    recorder = Recorder(answer(429, headers={"Retry-After": "1"}))
    client, sleeps = make_client(recorder, max_retries=2)
    async with client:
        with pytest.raises(HubUnavailable) as raised:
            await client.search("x")

    assert len(recorder.requests) == 3
    assert all(pause >= 1.0 for pause in sleeps)
    assert raised.value.status == 429


@pytest.mark.anyio
async def test_a_negative_retry_after_is_ignored_for_the_usual_backoff() -> None:
    recorder = Recorder(answer(503, headers={"Retry-After": "-30"}), answer(200, POST_42))
    client, sleeps = make_client(recorder)
    async with client:
        await client.get_post("p-42")

    assert len(sleeps) == 1
    assert 0.125 <= sleeps[0] <= 0.25  # the first backoff step, half of it drawn at random


@pytest.mark.anyio
async def test_no_retry_when_the_wait_would_outlast_the_callers_budget() -> None:
    recorder = Recorder(answer(503, headers={"Retry-After": "5"}), answer(200, POST_42))
    client, sleeps = make_client(recorder)
    async with client:
        with pytest.raises(HubUnavailable):
            await client.get_post("p-42", timeout_s=1.0)

    assert len(recorder.requests) == 1
    assert sleeps == []


@pytest.mark.anyio
async def test_a_retry_after_longer_than_the_cap_gives_up_at_once() -> None:
    recorder = Recorder(answer(503, headers={"Retry-After": "3600"}), answer(200, POST_42))
    client, sleeps = make_client(recorder)
    async with client:
        with pytest.raises(HubUnavailable):
            await client.get_post("p-42")

    assert len(recorder.requests) == 1
    assert sleeps == []


@pytest.mark.anyio
async def test_connection_errors_are_retried_then_unavailable() -> None:
    recorder = Recorder(httpx2.ConnectError("[Errno 111] Connection refused"))
    client, _ = make_client(recorder, max_retries=1)
    async with client:
        with pytest.raises(HubUnavailable) as raised:
            await client.get_post("p-42")

    assert len(recorder.requests) == 2
    assert raised.value.status is None
    assert "GET /posts/p-42: connection failed" in str(raised.value)


@pytest.mark.anyio
async def test_a_hub_slower_than_the_timeout_is_unavailable() -> None:
    async def never_answers(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep(30)
        return answer(200, POST_42)

    client, _ = make_client(never_answers, timeout_s=0.05, max_retries=1)
    async with client:
        with pytest.raises(HubUnavailable) as raised:
            await client.get_post("p-42")

    assert "timed out" in str(raised.value)


# -- rejections ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failures_raise_hub_auth_error_without_retrying(status: int) -> None:
    recorder = Recorder(answer(status, {"error": "invalid bearer token"}))
    client, sleeps = make_client(recorder)
    async with client:
        with pytest.raises(HubAuthError) as raised:
            await client.budget_health("a1")

    assert len(recorder.requests) == 1
    assert sleeps == []
    assert raised.value.status == status
    assert isinstance(raised.value, HubRejected)


@pytest.mark.anyio
async def test_404_raises_hub_not_found_with_the_hubs_message() -> None:
    recorder = Recorder(answer(404, {"error": "post p-9 not found"}))
    client, _ = make_client(recorder)
    async with client:
        with pytest.raises(HubNotFound) as raised:
            await client.create_comment("p-9", agent_id="a1", content="x", idempotency_key="k")

    assert raised.value.hub_message == "post p-9 not found"
    assert str(raised.value) == "POST /posts/p-9/comments: 404 Not Found: post p-9 not found"
    assert len(recorder.requests) == 1


@pytest.mark.anyio
async def test_a_long_hub_message_is_cut_at_a_space_never_through_a_word() -> None:
    # The client has no redactor: a key the Hub quotes is kept whole (the worker masks it
    # wherever it shows the message) or left out, never halved past recognition.
    key = "sk-proj-0123456789abcdefghijklmnop"
    detail = "w " * 140 + f"{key} is not a valid key"
    recorder = Recorder(answer(422, {"detail": detail}))
    client, _ = make_client(recorder)
    async with client:
        with pytest.raises(HubRejected) as raised:
            await client.create_post(agent_id="a1", content="x", idempotency_key="k")

    assert raised.value.hub_message == ("w " * 140).rstrip()
    assert key[:8] not in str(raised.value)


@pytest.mark.anyio
async def test_other_4xx_is_rejected_with_status_and_message() -> None:
    recorder = Recorder(answer(422, {"detail": "content is required"}))
    client, _ = make_client(recorder)
    async with client:
        with pytest.raises(HubRejected) as raised:
            await client.create_post(agent_id="a1", content="", idempotency_key="k")

    assert type(raised.value) is HubRejected
    assert raised.value.status == 422
    assert raised.value.hub_message == "content is required"


@pytest.mark.anyio
@pytest.mark.parametrize("status", [501, 505])
async def test_a_server_that_cannot_serve_the_request_at_all_rejects_it_without_retrying(
    status: int,
) -> None:
    recorder = Recorder(answer(status, {"error": "not implemented"}))
    client, sleeps = make_client(recorder)
    async with client:
        with pytest.raises(HubRejected) as raised:
            await client.create_post(agent_id="a1", content="x", idempotency_key="k")

    assert raised.value.status == status
    assert len(recorder.requests) == 1
    assert sleeps == []


@pytest.mark.anyio
async def test_an_answer_missing_required_fields_is_a_hub_error() -> None:
    recorder = Recorder(answer(200, {"title": "no id, no author"}))
    client, _ = make_client(recorder)
    async with client:
        with pytest.raises(HubError) as raised:
            await client.get_post("p-1")

    assert not isinstance(raised.value, HubUnavailable | HubRejected)
    assert raised.value.method == "GET"
    assert raised.value.path == "/posts/p-1"


@pytest.mark.anyio
async def test_the_api_key_never_appears_in_errors_even_when_the_hub_echoes_it() -> None:
    echo = {"error": f"token {API_KEY} is not allowed"}
    cases: list[httpx2.Response | Exception] = [
        answer(401, echo),
        answer(422, echo),
        answer(503, echo),
        httpx2.ConnectError(f"proxy said no to {API_KEY}"),
    ]
    messages = []
    for case in cases:
        client, _ = make_client(Recorder(case), max_retries=0)
        async with client:
            with pytest.raises(HubError) as raised:
                await client.get_post("p-1")
        messages.append(str(raised.value))
        if isinstance(raised.value, HubRejected):
            messages.append(raised.value.hub_message)
        messages.append(repr(client))

    assert len(messages) == 10
    assert all(API_KEY not in message for message in messages)
    assert any("[redacted]" in message for message in messages)


def test_errors_survive_pickling_with_their_details() -> None:
    original = HubNotFound(
        "GET /posts/p-1: 404 Not Found: gone",
        method="GET",
        path="/posts/p-1",
        status=404,
        hub_message="gone",
    )
    restored = pickle.loads(pickle.dumps(original))

    assert type(restored) is HubNotFound
    assert str(restored) == str(original)
    assert (restored.status, restored.hub_message, restored.path) == (404, "gone", "/posts/p-1")


@pytest.mark.anyio
async def test_a_maintenance_page_with_200_is_an_outage_retried_then_unavailable() -> None:
    page = httpx2.Response(
        200, text="<html>Down for maintenance</html>", headers={"content-type": "text/html"}
    )
    recorder = Recorder(page, page, answer(201, {"id": "c-9"}))
    client, sleeps = make_client(recorder, max_retries=1)
    async with client:
        with pytest.raises(HubUnavailable) as raised:
            await client.report_consumption(
                ConsumptionRecord(
                    agent_id="a1",
                    tokens_input=1,
                    tokens_output=1,
                    cost_usd=0.0,
                    activation_id="t-1",
                    task_type="notification",
                    duration_seconds=1.0,
                    outcome="completed",
                ),
                idempotency_key="t-1:consumption",
            )
        created = await client.create_comment(
            "p-1", agent_id="a1", content="x", idempotency_key="t-1:reply"
        )

    assert len(recorder.requests) == 3
    assert len(sleeps) == 1
    assert "answer is not JSON (200 OK, text/html)" in str(raised.value)
    assert raised.value.status == 200
    assert created.id == "c-9"


@pytest.mark.anyio
async def test_a_write_answered_without_an_id_is_a_hub_error_not_an_outage() -> None:
    client, _ = make_client(Recorder(answer(201, {"created": True})))
    async with client:
        with pytest.raises(HubError) as raised:
            await client.create_post(agent_id="a1", content="x", idempotency_key="t-1:reply")

    assert not isinstance(raised.value, HubUnavailable | HubRejected)
    assert "POST /posts: unexpected answer (id: Field required" in str(raised.value)


@pytest.mark.anyio
async def test_devhub_faults_can_answer_a_maintenance_page_to_one_method_only() -> None:
    from hub_client.devhub import create_app

    transport = httpx2.ASGITransport(app=create_app())
    async with httpx2.AsyncClient(transport=transport, base_url="http://devhub") as http:
        fault = {
            "status": 200,
            "count": 1,
            "method": "POST",
            "body": "<html>Down for maintenance</html>",
            "content_type": "text/html",
        }
        (await http.post("/api/v1/_dev/faults", json=fault)).raise_for_status()
    async with HubClient("http://devhub", transport=transport, max_retries=0) as client:
        assert await client.search("anything") == []  # a GET: not this fault's method
        with pytest.raises(HubUnavailable, match=r"not JSON \(200 OK, text/html\)"):
            await client.create_post(agent_id="a1", content="x", idempotency_key="k-1")
        created = await client.create_post(agent_id="a1", content="x", idempotency_key="k-1")

    assert created.id
