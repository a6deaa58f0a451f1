"""One absolute deadline per task: fixed at its first start, kept by re-runs, never a requeue."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import anyio
import fakeredis
import httpx2
import pytest

from hub_client import HubClient
from tests.support.pipeline import DEMO_AGENTS, HUB_KEY, Harness, notification
from worker.agents import AgentStore
from worker.coordination import (
    RedisJournal,
    fix_task_deadline,
    forget_task_deadline,
    read_task_deadline,
)
from worker.daemon._job_timeout import run_timeout_s
from worker.exceptions import ModelUnavailable
from worker.loop import AgentLoop, LoopSettings, ResponseEntry, RunLimits, RunResult
from worker.models import Message, ModelRequest, ModelResponse, Usage
from worker.models._scripted import ScriptedModel, Turn
from worker.redis_io import keys as redis_keys
from worker.task import Outcome, Task, parse_task
from worker.tools import CallContext, LocalToolbox
from worker.tools._idempotency import KeyedCallContext
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def run_loop(
    turns: list[Any], settings: LoopSettings, *, clock: Any = time.time, tools: Any = ()
) -> tuple[RunResult, ScriptedModel]:
    model = ScriptedModel(turns)
    loop = AgentLoop(
        model=model,
        toolbox=LocalToolbox(list(tools)),
        system="test",
        settings=settings,
        task_id="t-clock",
        agent_id="test-agent",
        clock=clock,
    )
    return await loop.run([Message(role="user", content="go")]), model


# --- the deadline in Redis -------------------------------------------------------------------


def test_the_first_start_fixes_the_deadline_and_re_runs_keep_it(redis: fakeredis.FakeRedis) -> None:
    first = fix_task_deadline(redis, "t-1", 60, clock=lambda: 1000.0)
    assert first.first_start and first.epoch_s == 1060.0
    again = fix_task_deadline(redis, "t-1", 60, clock=lambda: 1050.0)  # a re-run 50 s later
    assert not again.first_start and again.epoch_s == 1060.0
    assert 0 < redis.ttl(redis_keys.task_deadline("t-1")) <= 60 + 86_400


def test_a_re_run_can_tighten_the_deadline_never_extend_it(redis: fakeredis.FakeRedis) -> None:
    fix_task_deadline(redis, "t-1", 300, clock=lambda: 1000.0)
    tightened = fix_task_deadline(redis, "t-1", 10, clock=lambda: 1100.0)
    assert tightened.epoch_s == 1110.0
    assert fix_task_deadline(redis, "t-1", 900, clock=lambda: 1100.0).epoch_s == 1300.0


def test_a_damaged_deadline_counts_from_now_and_a_forgotten_one_starts_afresh(
    redis: fakeredis.FakeRedis,
) -> None:
    redis.set(redis_keys.task_deadline("t-1"), "soon")
    assert fix_task_deadline(redis, "t-1", 30, clock=lambda: 500.0).epoch_s == 530.0
    forget_task_deadline(redis, "t-1")
    assert read_task_deadline(redis, "t-1") is None


# --- rq's hard timeout follows the effective deadline -----------------------------------------


def exploration(**constraints: Any) -> Task:
    raw: dict[str, Any] = {"task_id": "t-1", "type": "exploration", "agent_id": "demo-agent"}
    if constraints:
        raw["constraints"] = constraints
    return parse_task(raw)


def test_rq_timeout_never_takes_a_tasks_looser_value_over_the_agents(
    redis: fakeredis.FakeRedis,
) -> None:
    agents = AgentStore(str(DEMO_AGENTS), redis=redis)  # demo-agent: max_duration_s 120
    assert (
        run_timeout_s(redis, exploration(max_duration_s=86_400), grace_s=60, agents=agents) == 180
    )
    assert run_timeout_s(redis, exploration(max_duration_s=30), grace_s=60, agents=agents) == 90
    assert run_timeout_s(redis, exploration(), grace_s=60, agents=agents) == 180


def test_rq_timeout_never_waits_on_an_http_source(redis: fakeredis.FakeRedis) -> None:
    remote = AgentStore("http://127.0.0.1:9/definitions", redis=redis)  # nothing listens
    task = exploration(max_duration_s=86_400)
    # Not cached: the job process alone holds the task to the agent's limit.
    assert run_timeout_s(redis, task, grace_s=60, agents=remote) == 86_460


def test_rq_timeout_without_the_agent_uses_the_task_or_the_default(
    redis: fakeredis.FakeRedis,
) -> None:
    assert run_timeout_s(redis, exploration(max_duration_s=100), grace_s=60) == 160
    assert run_timeout_s(redis, exploration(), grace_s=60) == 360


def test_rq_timeout_of_a_re_run_is_what_is_left_of_its_deadline(redis: fakeredis.FakeRedis) -> None:
    fix_task_deadline(redis, "t-1", 300, clock=lambda: 1000.0)
    task = exploration(max_duration_s=300)
    assert run_timeout_s(redis, task, grace_s=60, now=1250.0) == 110
    assert run_timeout_s(redis, task, grace_s=60, now=2000.0) == 60  # past it: grace only


# --- the loop: a deadline is reached, never a requeue ----------------------------------------


async def test_a_model_call_cut_by_the_deadline_ends_deadline_with_a_closing_answer() -> None:
    clock = FakeClock()

    def provider_timed_out(request: ModelRequest) -> Turn:
        clock.now += 95  # the call ran until its timeout: 90 s of a 100 s task, and more
        return Turn(error=ModelUnavailable("timed out", provider="openai", model="m"))

    settings = LoopSettings(limits=RunLimits(max_duration_s=100), deadline_epoch=clock.now + 100)
    turns = [provider_timed_out, Turn(text="closing answer")]
    result, model = await run_loop(turns, settings, clock=clock)
    assert result.outcome is Outcome.DEADLINE
    assert result.error is None  # not a model error: nothing to requeue
    assert result.output == "closing answer"
    closing = model.requests[-1]
    assert not closing.tools_callable and closing.timeout_s == pytest.approx(5)


async def test_a_hanging_model_call_ends_deadline_not_model_error() -> None:
    async def hang(request: ModelRequest) -> Turn:
        await anyio.sleep(30)
        return Turn(text="never")

    settings = LoopSettings(limits=RunLimits(max_duration_s=1.0), deadline_epoch=time.time() + 1)
    result, _ = await run_loop([hang], settings)
    assert result.outcome is Outcome.DEADLINE
    assert result.error is None and result.fallback


async def test_a_model_call_that_fails_early_is_still_a_model_error() -> None:
    unavailable = ModelUnavailable("503 x5", provider="openai", model="m")
    settings = LoopSettings(limits=RunLimits(max_duration_s=100))
    result, _ = await run_loop([Turn(error=unavailable)], settings)
    assert result.outcome is Outcome.MODEL_ERROR  # the job decides: requeue or deadline


async def test_tool_calls_left_at_the_deadline_are_not_run_and_the_run_winds_down() -> None:
    clock = FakeClock()
    ran: list[int] = []

    def slow(n: int) -> str:
        ran.append(n)
        clock.now += 95
        return "slow"

    tools = [LocalTool(name="slow", function=slow, input_schema=SCHEMA)]
    settings = LoopSettings(limits=RunLimits(max_duration_s=100), deadline_epoch=clock.now + 100)
    turns = [Turn(tool_calls=[("slow", {"n": 1}), ("slow", {"n": 2})]), Turn(text="closing")]
    result, model = await run_loop(turns, settings, clock=clock, tools=tools)
    assert ran == [1]
    assert result.outcome is Outcome.DEADLINE and result.output == "closing"
    skipped = result.steps[0].tool_calls[1]
    assert skipped.outcome == "deadline" and skipped.is_error
    # Every call the model made has its result in the closing request.
    assert [m.tool_call_id for m in model.requests[-1].messages if m.role == "tool"] == [
        call.id for call in result.steps[0].requested_calls
    ]


async def test_every_tool_call_context_carries_the_tasks_deadline() -> None:
    seen: list[float | None] = []

    def tick(n: int, ctx: Any) -> str:
        seen.append(ctx.deadline_epoch)
        return "ok"

    deadline = time.time() + 120
    tools = [LocalTool(name="tick", function=tick, input_schema=SCHEMA, wants_context=True)]
    settings = LoopSettings(limits=RunLimits(max_duration_s=300), deadline_epoch=deadline)
    turns = [Turn(tool_calls=[("tick", {"n": 1})]), Turn(text="done")]
    result, model = await run_loop(turns, settings, tools=tools)
    assert result.outcome is Outcome.COMPLETED
    assert seen == [deadline]
    # The shared deadline, not max_duration_s from this run's start, bounds the calls.
    assert all(r.timeout_s is not None and r.timeout_s <= 120 for r in model.requests)


# --- the job: re-runs continue against the first run's deadline ------------------------------


async def test_a_re_run_continues_against_the_deadline_the_first_run_fixed(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="Answer.")], redis=redis)
    post_id = await h.seed_post()
    h.redis.set(redis_keys.task_deadline("t-1"), repr(time.time() + 20))  # an earlier run's
    verdict = await h.run(notification(post_id))
    assert verdict.report.outcome is Outcome.COMPLETED
    [request] = h.model.requests
    assert request.timeout_s is not None and request.timeout_s <= 20
    assert read_task_deadline(h.redis, "t-1") is None  # ended for good: forgotten


async def test_a_re_run_after_the_deadline_ends_deadline_keeping_earlier_usage(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="never asked")], redis=redis)
    post_id = await h.seed_post()
    h.redis.set(redis_keys.task_deadline("t-1"), repr(time.time() - 5))
    RedisJournal(h.redis, "t-1").append(
        ResponseEntry(
            step=1,
            response=ModelResponse(
                text="",
                usage=Usage(input_tokens=300, output_tokens=40, cost_usd=0.001),
                provider="openai",
                model="gpt-4o-mini",
            ),
        )
    )
    verdict = await h.run(notification(post_id))
    report = verdict.report
    assert report.outcome is Outcome.DEADLINE and verdict.requeue is None
    assert h.model.requests == []
    assert (report.tokens_input, report.tokens_output, report.llm_calls) == (300, 40, 1)
    [consumption] = (await h.state())["consumption"]
    assert consumption["outcome"] == "deadline" and consumption["tokens_input"] == 300


async def test_a_requeue_that_would_land_past_the_deadline_ends_deadline(
    redis: fakeredis.FakeRedis,
) -> None:
    unavailable = ModelUnavailable("503 x5", provider="openai", model="m", retry_after_s=7)
    h = Harness([Turn(error=unavailable)], redis=redis)
    post_id = await h.seed_post()
    # The first requeue waits 30 s; the task has 20 s in all.
    verdict = await h.run(notification(post_id, constraints={"max_duration_s": 20}))
    assert verdict.report.outcome is Outcome.DEADLINE
    assert verdict.requeue is None
    assert verdict.report.error is not None and "503" in verdict.report.error.message
    assert read_task_deadline(h.redis, "t-1") is None


async def test_a_requeue_within_the_deadline_keeps_the_deadline_for_the_next_run(
    redis: fakeredis.FakeRedis,
) -> None:
    unavailable = ModelUnavailable("503 x5", provider="openai", model="m")
    h = Harness([Turn(error=unavailable)], redis=redis)
    post_id = await h.seed_post()
    verdict = await h.run(notification(post_id))  # the demo agent has 120 s
    assert verdict.report.outcome is Outcome.REQUEUED
    kept = read_task_deadline(h.redis, "t-1")
    assert kept is not None and 0 < kept - time.time() <= 120


class RecordingTransport(httpx2.AsyncBaseTransport):
    """The devhub in process, remembering each request's read timeout by path."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.timeouts: dict[str, list[float]] = {}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        self.timeouts.setdefault(request.url.path, []).append(timeout)
        return await self.inner.handle_async_request(request)


async def test_hub_calls_before_the_loop_get_the_time_left_as_their_timeout(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="Answer.")], redis=redis)
    post_id = await h.seed_post()
    recording = RecordingTransport(httpx2.ASGITransport(app=h.app))
    h.hub = lambda: HubClient("http://devhub", HUB_KEY, transport=recording)  # type: ignore[method-assign]
    h.redis.set(redis_keys.task_deadline("t-1"), repr(time.time() + 3))  # 3 s left
    verdict = await h.run(notification(post_id))
    # 3 s is within the closing answer's reserve: one tool-less call, and its answer posted.
    assert verdict.report.outcome is Outcome.DEADLINE
    assert verdict.report.output == "Answer." and verdict.report.posted
    budget = recording.timeouts["/api/v1/system/budget-health"]
    thread = recording.timeouts[f"/api/v1/posts/{post_id}"]
    # Not their own 5 s and 15 s defaults: what was left of the task's 3 s.
    assert budget and all(0 < timeout <= 3 for timeout in budget)
    assert thread and all(0 < timeout <= 3 for timeout in thread)


def test_a_tool_calls_context_with_the_deadline_keeps_every_other_field() -> None:
    ctx = CallContext(task_id="t-1", agent_id="a", step=3, index=2, timeout_s=7.5)
    stamped = ctx.with_deadline(1234.5)
    assert stamped == dataclasses.replace(ctx, deadline_epoch=1234.5)
    # A field added to CallContext and not copied by with_deadline fails here.
    defaults = {field.name: field.default for field in dataclasses.fields(CallContext)}
    assert set(defaults) == {"task_id", "agent_id", "step", "index", "timeout_s", "deadline_epoch"}


def test_a_keyed_context_with_the_deadline_keeps_its_key() -> None:
    ctx = KeyedCallContext(task_id="t-1", agent_id="a", step=3, index=2, timeout_s=7.5, key="k-1")
    stamped = ctx.with_deadline(1234.5)
    assert isinstance(stamped, KeyedCallContext)
    assert (stamped.idempotency_key, stamped.deadline_epoch) == ("k-1", 1234.5)
