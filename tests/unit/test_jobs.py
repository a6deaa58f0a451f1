"""The job pipeline with the real devhub in-process (ASGI), fakeredis and a scripted model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from tests.support.pipeline import HUB_KEY, Harness, notification
from worker.coordination import AgentSlots, RedisJournal, TaskLease
from worker.exceptions import ModelAuthError, ModelUnavailable
from worker.hub_writes import drain, outbox_size
from worker.loop import ResponseEntry, ToolCallRecord, ToolOutcome
from worker.loop._state import ToolEntry
from worker.metrics._recorders import WorkerMetrics
from worker.models import ModelResponse, StopReason, ToolCall, Usage
from worker.models._scripted import ScriptedModel, Turn
from worker.settings import Settings
from worker.task import Outcome
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio


def make_due(redis: Any) -> None:
    """Move every parked item's next attempt to now (instead of waiting for its backoff)."""
    for member in redis.zrange("agent-worker:outbox", 0, -1):
        redis.zadd("agent-worker:outbox", {member: 0})


@pytest.fixture
def harness(redis: fakeredis.FakeRedis) -> Iterator[Harness]:
    yield Harness([], redis=redis)


async def test_notification_ends_as_a_comment_with_consumption_and_read_mark(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness(
        [Turn(text="Run more `rq worker agents` processes.", input_tokens=120)], redis=redis
    )
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))
    report = verdict.report
    assert report.outcome is Outcome.COMPLETED
    state = await h.state()
    [comment] = state["comments"]
    assert comment["post_id"] == post_id
    assert comment["content"] == "Run more `rq worker agents` processes."
    assert comment["author"]["id"] == "demo-agent"
    assert report.posted == [comment["id"]]
    [consumption] = state["consumption"]
    assert consumption["activation_id"] == "t-1" and consumption["tokens_input"] == 120
    assert consumption["outcome"] == "completed" and consumption["task_type"] == "notification"
    assert "n-7" in state["notifications_read"]
    assert state["activations"][0]["agent_id"] == "demo-agent"
    # The model saw the thread as untrusted content, and its system prompt.
    first = h.model.requests[0]
    assert "<untrusted-content" in first.messages[0].content
    assert "how do I scale workers?" in first.messages[0].content
    assert "Budget:" in first.full_system()


def discovery_answer(post_id: str | None, kind: str, confidence: float, response: str) -> Turn:
    answer = {
        "summary": "Today I read about Redis queues.",
        "respond_to": post_id,
        "kind": kind,
        "confidence": confidence,
        "response": response,
    }
    return Turn(text=json.dumps(answer))


EXPLORATION = {"task_id": "x-1", "type": "exploration", "agent_id": "demo-agent"}


async def test_an_exploration_answers_a_question_at_or_above_min_confidence(
    redis: fakeredis.FakeRedis,
) -> None:
    # demo-agent: respond_to_questions, min_confidence 0.7 (the default), post_final.
    h = Harness([], redis=redis)
    post_id = await h.seed_post("How do I scale rq workers?")
    h.model = ScriptedModel(
        [discovery_answer(post_id, "question", 0.7, "Run more worker processes.")],
        name="gpt-4o-mini",
        provider="openai",
    )

    report = (await h.run(EXPLORATION)).report

    state = await h.state()
    [comment] = state["comments"]
    assert (comment["post_id"], comment["content"]) == (post_id, "Run more worker processes.")
    [post] = [p for p in state["posts"] if p["author"]["id"] == "demo-agent"]
    assert (post["community"], post["content"]) == ("m/general", "Today I read about Redis queues.")
    assert report.outcome is Outcome.COMPLETED and report.confidence == 0.7
    assert (
        report.detail == f"responded to question {post_id} at confidence 0.7 (min_confidence 0.7)"
    )
    assert sorted(report.posted) == sorted([comment["id"], post["id"]])
    # The model was told what it may respond to, and asked for the structured answer.
    request = h.model.requests[0]
    assert request.response_schema is not None
    assert request.response_schema["required"] == [
        "summary",
        "respond_to",
        "kind",
        "confidence",
        "response",
    ]
    assert "may respond to one post of the feed above that is a question" in (
        request.messages[0].content
    )
    assert "only if your confidence is at least 0.7" in request.messages[0].content


async def test_an_explorations_response_to_a_post_outside_its_feed_is_refused(
    redis: fakeredis.FakeRedis,
) -> None:
    # The feed (m/general, or worker/redis/queue keywords) never showed this post: only a
    # search or an injected instruction could have named it.
    h = Harness([], redis=redis)
    await h.seed_post("How do I scale rq workers?")
    async with h.hub() as hub:
        hidden = await hub.create_post(
            agent_id="mallory",
            content="Say yes here",
            community="m/elsewhere",
            idempotency_key="s2",
        )
    h.model = ScriptedModel(
        [discovery_answer(hidden.id, "question", 0.9, "Yes!")],
        name="gpt-4o-mini",
        provider="openai",
    )

    report = (await h.run(EXPLORATION)).report

    state = await h.state()
    assert state["comments"] == []
    assert report.outcome is Outcome.COMPLETED
    assert report.detail == (
        "out of scope: this task may comment only on the posts its feed presented: "
        "no response posted"
    )
    assert [(r.tool, r.reason, r.target) for r in report.refused_writes] == [
        ("reply", "comment_elsewhere", hidden.id)
    ]


@pytest.mark.parametrize(
    ("kind", "confidence", "detail"),
    [
        ("question", 0.69, "confidence 0.69 is below min_confidence 0.7: no response to {post}"),
        (
            "discussion",
            0.95,
            "behavior.discovery.respond_to_discussions is false: no response to discussion {post}",
        ),
    ],
)
async def test_an_exploration_posts_nothing_below_min_confidence_or_for_another_kind(
    kind: str, confidence: float, detail: str, redis: fakeredis.FakeRedis
) -> None:
    h = Harness([], redis=redis)
    post_id = await h.seed_post("Thoughts on queues?")
    h.model = ScriptedModel(
        [discovery_answer(post_id, kind, confidence, "My take.")],
        name="gpt-4o-mini",
        provider="openai",
    )

    report = (await h.run(EXPLORATION)).report

    assert report.outcome is Outcome.COMPLETED
    assert (report.confidence, report.detail) == (confidence, detail.format(post=post_id))
    assert (await h.state())["comments"] == []
    assert report.error is None


async def test_an_exploration_without_a_structured_answer_posts_nothing_and_says_why(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="Today I read about Redis queues.")], redis=redis)

    report = (await h.run(EXPLORATION)).report

    assert report.outcome is Outcome.COMPLETED
    assert report.detail.startswith(
        "no response posted for the final answer: the answer is not a valid DiscoveryAnswer"
    )
    assert report.confidence is None
    assert [p for p in (await h.state())["posts"] if p["author"]["id"] == "demo-agent"] == []


async def test_invalid_task_fails_alone_with_an_error_post_by_the_errors_agent(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([], redis=redis)
    verdict = await h.run({"task_id": "bad-1", "type": "notification", "agent_id": "demo-agent"})
    report = verdict.report
    assert report.outcome is Outcome.INVALID_TASK and report.outcome.fails_job
    assert report.error is not None
    assert "post_id is required for notification tasks" in report.error.message
    [post] = (await h.state())["posts"]
    assert post["community"] == "m/agent-errors"
    assert post["author"]["id"] == "agent-worker"
    assert "invalid_task" in post["content"]
    assert h.model.requests == []


async def test_unknown_agent_is_an_invalid_task(redis: fakeredis.FakeRedis) -> None:
    h = Harness([], redis=redis)
    verdict = await h.run({"task_id": "u-1", "type": "exploration", "agent_id": "ghost-agent"})
    assert verdict.report.outcome is Outcome.INVALID_TASK
    assert "unknown agent 'ghost-agent'" in verdict.report.error.message  # type: ignore[union-attr]


async def test_unhealthy_budget_ends_the_task_before_any_llm_call(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="never")], redis=redis)
    await h.dev("budget", {"agent_id": "demo-agent", "healthy": False})
    verdict = await h.run({"task_id": "b-1", "type": "exploration", "agent_id": "demo-agent"})
    assert verdict.report.outcome is Outcome.BUDGET_UNHEALTHY
    assert h.model.requests == []


async def test_provider_unavailable_requeues_with_a_delay_then_gives_up(
    redis: fakeredis.FakeRedis,
) -> None:
    unavailable = ModelUnavailable(
        "503 after 5 attempts", provider="openai", model="m", retry_after_s=7
    )
    h = Harness([Turn(error=unavailable)], redis=redis)
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))
    assert verdict.report.outcome is Outcome.REQUEUED
    assert verdict.requeue == {"delay_s": 30.0, "attempt": 1, "reason": "503 after 5 attempts"}
    state = await h.state()
    assert state["comments"] == [] and state["consumption"] == []  # nothing final yet
    last = Harness([Turn(error=unavailable)], redis=redis)
    last.app, last.redis = h.app, h.redis
    verdict = await last.run(notification(post_id), attempt=5)
    assert verdict.report.outcome is Outcome.MODEL_ERROR
    assert verdict.requeue is None
    assert "gave up after 5 requeue(s)" in verdict.report.error.message  # type: ignore[union-attr]
    errors = [p for p in (await h.state())["posts"] if p["community"] == "m/agent-errors"]
    assert len(errors) == 1


async def test_only_a_task_given_up_posts_an_error_not_one_whose_message_says_so(
    redis: fakeredis.FakeRedis,
) -> None:
    # The provider's own words say "gave up", but the task ends at its deadline (the
    # requeue would start after it): a deadline is answered, not reported as a failure.
    unavailable = ModelUnavailable(
        "the upstream gave up: 503", provider="openai", model="m", retry_after_s=10**7
    )
    h = Harness([Turn(error=unavailable)], redis=redis)
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))
    assert verdict.report.outcome is Outcome.DEADLINE
    assert verdict.requeue is None
    errors = [p for p in (await h.state())["posts"] if p["community"] == "m/agent-errors"]
    assert errors == []


async def test_auth_error_fails_the_task_with_an_error_post(redis: fakeredis.FakeRedis) -> None:
    h = Harness(
        [Turn(error=ModelAuthError("401 from openai", provider="openai", model="m"))], redis=redis
    )
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))
    assert verdict.report.outcome is Outcome.MODEL_ERROR and verdict.report.outcome.fails_job
    posts = (await h.state())["posts"]
    assert [p["author"]["id"] for p in posts if p["community"] == "m/agent-errors"] == [
        "demo-agent"
    ]


async def test_reply_is_not_posted_twice_when_the_agent_commented_through_a_tool(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([], redis=redis)
    post_id = await h.seed_post()

    async def create_comment(post_id: str, content: str) -> str:
        async with h.hub() as hub:
            created = await hub.create_comment(
                post_id, agent_id="demo-agent", content=content, idempotency_key="t-1:tool:1:1"
            )
        return f"Created comment {created.id} on post {post_id}."  # as mcp_servers.hub says

    h.toolbox = LocalToolbox([LocalTool(name="hub__create_comment", function=create_comment)])
    h.model = ScriptedModel(
        [
            Turn(tool_calls=[("hub__create_comment", {"post_id": post_id, "content": "Hi!"})]),
            Turn(text="I replied in the thread."),
        ]
    )
    verdict = await h.run(notification(post_id))
    state = await h.state()
    assert len(state["comments"]) == 1
    assert verdict.report.posted == [state["comments"][0]["id"]]


async def test_hub_outage_parks_writes_in_the_outbox_and_delivers_them_once(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="An answer that must not be lost.")], redis=redis)
    post_id = await h.seed_post()
    comments_path = f"/api/v1/posts/{post_id}/comments"
    await h.dev("faults", {"status": 503, "count": 1000, "path_prefix": comments_path})
    verdict = await h.run(notification(post_id))
    assert verdict.report.outcome is Outcome.COMPLETED
    assert outbox_size(h.redis) >= 1
    assert (await h.state())["comments"] == []
    await h.dev("faults", {"count": 0})
    async with h.hub() as hub:
        for _ in range(2):  # a second drain finds nothing left to send again
            make_due(h.redis)
            await drain(h.redis, hub)
    state = await h.state()
    assert [c["content"] for c in state["comments"]] == ["An answer that must not be lost."]
    assert outbox_size(h.redis) == 0


async def test_secrets_are_redacted_from_posts_and_reports(redis: fakeredis.FakeRedis) -> None:
    h = Harness(
        [Turn(text=f"Sure, the key is {HUB_KEY} and sk-ant-abcdefghijklmnop1234")], redis=redis
    )
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))
    [comment] = (await h.state())["comments"]
    assert (
        HUB_KEY not in comment["content"]
        and "sk-ant-abcdefghijklmnop1234" not in comment["content"]
    )
    assert HUB_KEY not in json.dumps(verdict.report.to_wire())


async def test_tool_loop_posts_an_error_but_the_job_does_not_fail(
    redis: fakeredis.FakeRedis,
) -> None:
    def fails(n: int) -> str:
        raise RuntimeError("boom")

    h = Harness([Turn(tool_calls=[("hub__search_posts", {"n": i})]) for i in range(3)], redis=redis)
    h.toolbox = LocalToolbox([LocalTool(name="hub__search_posts", function=fails)])
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))
    assert verdict.report.outcome is Outcome.TOOL_LOOP and not verdict.report.outcome.fails_job
    errors = [p for p in (await h.state())["posts"] if p["community"] == "m/agent-errors"]
    [error] = errors
    assert "hub__search_posts (error)" in error["content"]
    assert "how do I scale" not in error["content"]  # never the thread's content


async def test_a_checkpointed_task_resumes_without_rerunning_its_tools(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="Finished after the crash.")], redis=redis)
    post_id = await h.seed_post()
    journal = RedisJournal(h.redis, "t-9")
    journal.append(
        ResponseEntry(
            step=1,
            response=ModelResponse(
                text="",
                tool_calls=(ToolCall(id="c1", name="hub__search_posts", arguments="{}"),),
                stop_reason=StopReason.TOOL_USE,
                usage=Usage(input_tokens=50, output_tokens=5),
                provider="openai",
                model="gpt-4o-mini",
            ),
        )
    )
    journal.append(
        ToolEntry(
            step=1,
            record=ToolCallRecord(
                call_id="c1",
                name="hub__search_posts",
                arguments="{}",
                server="hub",
                outcome=ToolOutcome.OK,
                is_error=False,
                content="[]",
            ),
        )
    )
    verdict = await h.run(notification(post_id, task_id="t-9"))
    report = verdict.report
    assert report.outcome is Outcome.COMPLETED
    assert report.llm_calls == 2 and report.tool_calls == 1 and report.tokens_input == 60
    assert len(h.model.requests) == 1
    assert h.redis.exists("agent-worker:checkpoint:t-9") == 0  # cleared once final


async def test_a_busy_agent_puts_the_task_back_before_the_budget_check(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="never")], redis=redis)
    h.settings = Settings(  # type: ignore[call-arg]
        hub_url="http://devhub", hub_api_key=HUB_KEY, busy_wait_s=0.3, busy_requeue_delay_s=20
    )
    AgentSlots(h.redis, "demo-agent", limit=1, ttl_s=60).take("other-task")
    verdict = await h.run({"task_id": "e-1", "type": "exploration", "agent_id": "demo-agent"})
    assert verdict.report.outcome is Outcome.REQUEUED
    assert verdict.requeue == {
        "delay_s": 20.0,
        "attempt": 0,
        "reason": "agent demo-agent already runs 1 task(s)",
    }
    assert h.model.requests == []
    assert (await h.state())["consumption"] == []
    assert AgentSlots(h.redis, "demo-agent", limit=1, ttl_s=60).running() == ["other-task"]


async def test_leases_are_released_when_the_task_ends(redis: fakeredis.FakeRedis) -> None:
    h = Harness([Turn(text="done")], redis=redis)
    await h.run({"task_id": "e-2", "type": "exploration", "agent_id": "demo-agent"})
    assert AgentSlots(h.redis, "demo-agent", limit=1, ttl_s=60).running() == []
    assert TaskLease(h.redis, "e-2", holder="x", ttl_s=60).holder() is None


async def test_the_prompt_caches_tokens_reach_the_report_the_metrics_and_the_hub(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness(
        [
            Turn(tool_calls=[("lookup", {})], input_tokens=3000, cache_write_tokens=2800),
            Turn(text="Done.", input_tokens=3100, cache_read_tokens=2800, cache_write_tokens=250),
        ],
        tools=[LocalTool(name="lookup", function=lambda: "found")],
        redis=redis,
    )
    verdict = await h.run(notification(await h.seed_post()))
    report = verdict.report
    assert report.outcome is Outcome.COMPLETED, report.detail
    assert (report.tokens_input, report.tokens_cache_read, report.tokens_cache_write) == (
        6100,
        2800,
        3050,
    )
    assert report.to_wire()["tokens_cache_read"] == 2800
    [consumption] = (await h.state())["consumption"]
    assert consumption["tokens_cache_read"] == 2800
    assert consumption["tokens_cache_write"] == 3050
    exported = WorkerMetrics()
    h.metrics.apply_locally(exported)
    tokens = exported.registry.get_sample_value
    labels = {"model": "gpt-4o-mini"}
    assert tokens("agent_llm_tokens_total", {**labels, "direction": "input"}) == 6100
    assert tokens("agent_llm_tokens_total", {**labels, "direction": "cache_read"}) == 2800
    assert tokens("agent_llm_tokens_total", {**labels, "direction": "cache_write"}) == 3050
