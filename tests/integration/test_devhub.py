"""The real devhub as a subprocess, driven by the real HubClient."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hub_client import (
    ConsumptionRecord,
    HubAuthError,
    HubClient,
    HubNotFound,
    HubRejected,
    HubUnavailable,
)
from tests.support.devhub import DevHub, running_devhub

pytestmark = pytest.mark.integration

API_KEY = "devhub-test-key-42"


@pytest.fixture(scope="module")
def shared_hub() -> Iterator[DevHub]:
    with running_devhub(api_key=API_KEY) as hub:
        yield hub


@pytest.fixture
def hub(shared_hub: DevHub) -> DevHub:
    shared_hub.reset()
    return shared_hub


def client_for(hub: DevHub, *, max_retries: int = 3) -> HubClient:
    return HubClient(hub.url, hub.api_key, max_retries=max_retries)


def consumption(agent_id: str, cost_usd: float, *, task_id: str = "t-1") -> ConsumptionRecord:
    return ConsumptionRecord(
        agent_id=agent_id,
        tokens_input=1000,
        tokens_output=200,
        cost_usd=cost_usd,
        activation_id=task_id,
        task_type="notification",
        duration_seconds=3.5,
        outcome="completed",
    )


@pytest.mark.anyio
async def test_a_post_and_its_comment_come_back_as_a_thread(hub: DevHub) -> None:
    async with client_for(hub) as client:
        created = await client.create_post(
            agent_id="writer", content="Redis restarts hourly", title="Redis", idempotency_key="k1"
        )
        comment = await client.create_comment(
            created.id, agent_id="helper", content="Check maxmemory.", idempotency_key="k2"
        )
        thread = await client.get_post(created.id)

    assert created.id == "p-1"
    assert comment.id == "c-1"
    assert thread.author.id == "writer"
    assert thread.community == "m/general"
    assert thread.parent_id is None
    assert thread.created_at is not None and thread.created_at.tzinfo is not None
    assert [(c.id, c.author.id, c.content) for c in thread.comments] == [
        ("c-1", "helper", "Check maxmemory.")
    ]
    state = hub.state()
    assert [post["id"] for post in state["posts"]] == ["p-1"]
    assert state["comments"][0]["post_id"] == "p-1"


@pytest.mark.anyio
async def test_an_idempotent_replay_returns_the_first_answer_and_creates_nothing(
    hub: DevHub,
) -> None:
    async with client_for(hub) as client:
        first_post = await client.create_post(
            agent_id="a1", content="once", idempotency_key="t-1:reply"
        )
        again_post = await client.create_post(
            agent_id="a1", content="twice?", idempotency_key="t-1:reply"
        )
        first_comment = await client.create_comment(
            first_post.id, agent_id="a2", content="c", idempotency_key="t-2:reply"
        )
        again_comment = await client.create_comment(
            first_post.id, agent_id="a2", content="c", idempotency_key="t-2:reply"
        )
        for _ in range(2):
            await client.report_consumption(
                consumption("a1", 0.01), idempotency_key="t-1:consumption"
            )

    assert again_post == first_post
    assert again_comment == first_comment
    state = hub.state()
    assert [post["content"] for post in state["posts"]] == ["once"]
    assert len(state["comments"]) == 1
    assert len(state["consumption"]) == 1
    assert state["replays"] == 3


@pytest.mark.anyio
async def test_an_idempotency_key_reused_for_another_call_is_rejected(hub: DevHub) -> None:
    async with client_for(hub) as client:
        post = await client.create_post(agent_id="a1", content="x", idempotency_key="same")
        with pytest.raises(HubRejected) as raised:
            await client.create_comment(post.id, agent_id="a1", content="y", idempotency_key="same")

    assert raised.value.status == 422
    assert hub.state()["comments"] == []


@pytest.mark.anyio
async def test_a_wrong_or_missing_bearer_gets_401_and_changes_nothing(hub: DevHub) -> None:
    for api_key in ("not-the-key", None):
        async with HubClient(hub.url, api_key) as client:
            with pytest.raises(HubAuthError) as raised:
                await client.create_post(agent_id="a1", content="x", idempotency_key="k")
            assert raised.value.status == 401
            assert API_KEY not in str(raised.value)
    assert hub.state()["posts"] == []


@pytest.mark.anyio
async def test_unknown_posts_are_404_and_invalid_bodies_422(hub: DevHub) -> None:
    async with client_for(hub) as client:
        with pytest.raises(HubNotFound):
            await client.get_post("p-404")
        with pytest.raises(HubNotFound) as missing:
            await client.create_comment("p-404", agent_id="a1", content="x", idempotency_key="k")
        with pytest.raises(HubRejected) as invalid:
            await client.create_post(agent_id="a1", content="   ", idempotency_key="k2")

    assert missing.value.hub_message == "post p-404 not found"
    assert invalid.value.status == 422
    assert "content" in invalid.value.hub_message
    assert hub.state()["idempotency_keys"] == []


@pytest.mark.anyio
async def test_search_matches_text_case_insensitively_and_filters(hub: DevHub) -> None:
    async with client_for(hub) as client:
        for agent_id, community, content in [
            ("ops", "m/ops", "REDIS memory is full"),
            ("dev", "m/dev", "redis client pooling"),
            ("dev", "m/dev", "unrelated chatter"),
        ]:
            await client.create_post(
                agent_id=agent_id, community=community, content=content, idempotency_key=content
            )
        everything = await client.search("Redis")
        in_dev = await client.search("redis", community="m/dev")
        by_ops = await client.search("redis", author="ops")
        limited = await client.search("redis", limit=1)

    assert [post.content for post in everything] == ["redis client pooling", "REDIS memory is full"]
    assert [post.content for post in in_dev] == ["redis client pooling"]
    assert [post.author.id for post in by_ops] == ["ops"]
    assert [post.content for post in limited] == ["redis client pooling"]


@pytest.mark.anyio
async def test_a_direct_message_says_so_and_stays_out_of_search_and_feeds(hub: DevHub) -> None:
    direct = hub.seed_post("my door code is 4921", author="eve", visibility="direct")
    public = hub.seed_post("door codes in general", author="eve")
    async with client_for(hub) as client:
        dm, post = await client.get_post(direct), await client.get_post(public)
        found = await client.search("door")
        feed = await client.discover_feed(
            communities=["m/general"], keywords=[], exclude_responded=False, limit=10
        )

    assert (dm.visibility, dm.is_public) == ("direct", False)
    assert (post.visibility, post.is_public) == ("public", True)
    assert [p.id for p in found] == [public] and [p.id for p in feed] == [public]


@pytest.mark.anyio
async def test_discover_feed_matches_communities_or_keywords_and_skips_answered_posts(
    hub: DevHub,
) -> None:
    async with client_for(hub) as client:
        ids = {}
        for name, agent_id, community, content in [
            ("ops", "someone", "m/ops", "disk alert"),
            ("keyword", "someone", "m/random", "kubernetes upgrade notes"),
            ("offtopic", "someone", "m/random", "lunch"),
            ("mine", "me", "m/ops", "my own post"),
            ("answered", "someone", "m/ops", "a question I answered"),
        ]:
            created = await client.create_post(
                agent_id=agent_id, community=community, content=content, idempotency_key=name
            )
            ids[name] = created.id
        await client.create_comment(
            ids["answered"], agent_id="me", content="done", idempotency_key="answer"
        )

        fresh = await client.discover_feed(
            communities=["m/ops"], keywords=["Kubernetes"], agent_id="me"
        )
        including_mine = await client.discover_feed(
            communities=["ops"], keywords=["kubernetes"], agent_id="me", exclude_responded=False
        )

    assert [post.id for post in fresh] == [ids["keyword"], ids["ops"]]
    assert [post.id for post in including_mine] == [
        ids["answered"],
        ids["mine"],
        ids["keyword"],
        ids["ops"],
    ]


@pytest.mark.anyio
async def test_stale_agents_come_oldest_first_and_activation_refreshes_them(hub: DevHub) -> None:
    now = datetime.now(UTC)
    hub.register_agent("recent", last_activated_at=(now - timedelta(seconds=60)).isoformat())
    hub.register_agent(
        "old", name="Old One", last_activated_at=(now - timedelta(hours=5)).isoformat()
    )
    hub.register_agent("older", last_activated_at=(now - timedelta(days=2)).isoformat())
    hub.register_agent("never")

    async with client_for(hub) as client:
        before = await client.stale_agents(min_staleness_s=900)
        await client.mark_activated("old")
        after = await client.stale_agents(min_staleness_s=900)
        everyone_idle_a_minute = await client.stale_agents(min_staleness_s=30)

    assert [agent.id for agent in before] == ["never", "older", "old"]
    assert before[2].name == "Old One"
    assert before[0].last_activated_at is None
    assert [agent.id for agent in after] == ["never", "older"]
    assert [agent.id for agent in everyone_idle_a_minute] == ["never", "older", "recent"]
    activations = hub.state()["activations"]
    assert [activation["agent_id"] for activation in activations] == ["old"]
    assert activations[0]["at"].endswith("Z")


@pytest.mark.anyio
async def test_consumption_is_recorded_and_counted_in_budget_health(hub: DevHub) -> None:
    async with client_for(hub) as client:
        fresh = await client.budget_health("spender")
        await client.report_consumption(consumption("spender", 1.25), idempotency_key="t-1:c")
        unknown_price = consumption("spender", 0.0, task_id="t-2").model_copy(
            update={"cost_known": False}
        )
        await client.report_consumption(unknown_price, idempotency_key="t-2:c")
        await client.report_consumption(
            consumption("other", 4.0, task_id="t-3"), idempotency_key="t-3:c"
        )
        after = await client.budget_health("spender")

    assert fresh.healthy is True
    assert (fresh.daily_limit, fresh.monthly_limit, fresh.daily_used) == (10.0, 300.0, 0.0)
    assert after.daily_used == 1.25
    assert after.monthly_used == 1.25
    assert after.summary() == (
        "Budget: $1.25 of $10.00 used today (12%), $1.25 of $300.00 this month."
    )
    records = hub.state()["consumption"]
    assert [(r["activation_id"], r["cost_known"]) for r in records] == [
        ("t-1", True),
        ("t-2", False),
        ("t-3", True),
    ]
    assert records[0]["tokens_input"] == 1000
    assert records[0]["outcome"] == "completed"


@pytest.mark.anyio
async def test_budget_overrides_give_the_unhealthy_and_collective_answers(hub: DevHub) -> None:
    hub.set_budget("broke", healthy=False)
    hub.set_budget("fleet", collective=True, healthy=False, total_budget_usd=50, total_used_usd=51)
    hub.set_budget("fleet-ok", collective=True)

    async with client_for(hub) as client:
        broke = await client.budget_health("broke")
        fleet = await client.budget_health("fleet")
        fleet_ok = await client.budget_health("fleet-ok")
        untouched = await client.budget_health("someone-else")

    assert (broke.shape, broke.healthy) == ("simple", False)
    assert (fleet.shape, fleet.healthy) == ("collective", False)
    assert (fleet.total_budget_usd, fleet.total_used_usd) == (50.0, 51.0)
    assert fleet.overall_health == "critical"
    assert (fleet_ok.shape, fleet_ok.healthy) == ("collective", True)
    assert untouched.healthy is True


@pytest.mark.anyio
async def test_notifications_read_are_recorded_once_each(hub: DevHub) -> None:
    async with client_for(hub) as client:
        await client.mark_notifications_read(["n-1", "n-2"])
        await client.mark_notifications_read(["n-2", "n-3"])

    assert hub.state()["notifications_read"] == ["n-1", "n-2", "n-3"]


@pytest.mark.anyio
async def test_injected_faults_fail_the_next_requests_then_clear(hub: DevHub) -> None:
    hub.inject_faults(503, 1, path_prefix="/api/v1/posts")
    async with client_for(hub, max_retries=0) as client:
        with pytest.raises(HubUnavailable) as raised:
            await client.create_post(agent_id="a1", content="x", idempotency_key="k1")
        assert raised.value.status == 503
        # Other paths were never affected, and the fault is used up.
        assert (await client.budget_health("a1")).healthy is True
        created = await client.create_post(agent_id="a1", content="x", idempotency_key="k1")

        hub.inject_faults(500, 5)
        hub.inject_faults(500, 0)
        await client.search("x")

    async with client_for(hub, max_retries=3) as retrying:
        hub.inject_faults(503, 2, path_prefix="/api/v1/posts", retry_after=0)
        again = await retrying.create_post(agent_id="a1", content="y", idempotency_key="k2")

    assert created.id == "p-1"
    assert again.id == "p-2"
    assert [post["content"] for post in hub.state()["posts"]] == ["x", "y"]


@pytest.mark.anyio
async def test_the_client_ignores_proxy_environment_variables(
    hub: DevHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    async with client_for(hub, max_retries=0) as client:
        health = await client.budget_health("a1")

    assert health.healthy is True


@pytest.mark.anyio
async def test_state_file_keeps_posts_and_idempotency_across_a_restart(tmp_path: Path) -> None:
    state_file = tmp_path / "devhub.json"
    with running_devhub(api_key=API_KEY, state_file=state_file) as hub:
        async with client_for(hub, max_retries=0) as client:
            first = await client.create_post(
                agent_id="a1", content="before the outage", idempotency_key="t-1:reply"
            )
            hub.stop()
            with pytest.raises(HubUnavailable) as raised:
                await client.get_post(first.id)
            assert "connection failed" in str(raised.value)

            hub.start_again()
            replayed = await client.create_post(
                agent_id="a1", content="retried after restart", idempotency_key="t-1:reply"
            )
            second = await client.create_post(
                agent_id="a1", content="after the outage", idempotency_key="t-2:reply"
            )
            thread = await client.get_post(first.id)

        state = hub.state()

    assert replayed == first
    assert thread.content == "before the outage"
    assert second.id == "p-2"
    assert [post["content"] for post in state["posts"]] == ["before the outage", "after the outage"]
    assert state["replays"] == 1
    assert hub.process is not None and hub.process.poll() is not None
