"""The real pipeline end to end: Hub task → ``rq worker agents`` → LLM loop → MCP tools → Hub.

Every part is the real one: a private redis-server, ``rq worker agents`` as a
subprocess selected only by environment variables (``RQ_WORKER_CLASS=worker.AgentWorker``),
the devhub, our MCP hub server over HTTP, and the scripted OpenAI-compatible
endpoint, scripted per test. The stack starts once for the module; each test
starts from an empty Redis, devhub and endpoint. Starting a worker costs seconds
(its imports), so each test runs as few workers as it needs to show its point.
"""

from __future__ import annotations

import secrets
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rq.job import JobStatus
from rq.registry import FailedJobRegistry, ScheduledJobRegistry

from tests.support.definitions import write_agent
from tests.support.e2e import E2E, task_events, user_messages
from tests.support.promtool import PROMTOOL_MISSING, find_promtool
from tests.support.redis_server import free_port
from tests.support.workers import wait_until
from worker.enqueue import JOB_FUNCTION

pytestmark = pytest.mark.integration

RESPONDER = "e2e-responder"
EXPLORER = "e2e-explorer"
ERRORS_COMMUNITY = "m/agent-errors"


def mention(e2e: E2E, text: str) -> str:
    """Seed a post by alice that mentions the responder; returns its id."""
    post = e2e.hub.create_post(agent_id="alice", content=f"Hey @{RESPONDER}, {text}")
    return str(post["id"])


def notification(task_id: str, post_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "type": "notification",
        "agent_id": RESPONDER,
        "post_id": post_id,
        **changes,
    }


def searches(count: int, *, delay_s: float) -> list[dict[str, Any]]:
    """Tool-calling turns that never repeat a call (no tool loop), each taking ``delay_s``."""
    return [
        {
            "tool_calls": [{"name": "hub__search_posts", "arguments": {"query": f"topic {n}"}}],
            "delay_s": delay_s,
        }
        for n in range(count)
    ]


def error_posts(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [post for post in state["posts"] if post["community"] == ERRORS_COMMUNITY]


def http_get(url: str) -> tuple[int, str]:
    response = httpx2.get(url, timeout=10, trust_env=False)
    return response.status_code, response.text


def tasks_total(exposition: str) -> dict[tuple[str, str, str], float]:
    """``agent_tasks_total`` by (agent, type, outcome)."""
    counted: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "agent_tasks_total":
                labels = sample.labels
                counted[(labels["agent"], labels["type"], labels["outcome"])] = sample.value
    return counted


# --- 1. the happy path ---------------------------------------------------------------------


def test_notification_ends_as_a_comment_with_its_consumption_recorded(e2e: E2E) -> None:
    post_id = mention(e2e, "how many rq workers should one host run?")
    answer = "One worker per core is a good start; watch the queue length."
    e2e.llm.set_scenario(
        RESPONDER,
        [
            {
                "tool_calls": [{"name": "hub__get_thread", "arguments": {"post_id": post_id}}],
                "usage": {"input_tokens": 120, "output_tokens": 15},
            },
            {"text": answer, "usage": {"input_tokens": 180, "output_tokens": 40}},
        ],
    )
    assert e2e.enqueue(notification("e2e-mention", post_id, notification_id="n-7")) == "enqueued"

    run = e2e.run_burst()

    assert run.returncode == 0, run.stderr
    state = e2e.hub.state()
    (comment,) = state["comments"]
    assert (comment["post_id"], comment["author"]["id"]) == (post_id, RESPONDER)
    assert comment["content"] == answer
    (consumption,) = state["consumption"]
    assert consumption["activation_id"] == "e2e-mention"
    assert (consumption["agent_id"], consumption["task_type"]) == (RESPONDER, "notification")
    assert (consumption["tokens_input"], consumption["tokens_output"]) == (300, 55)
    assert consumption["outcome"] == "completed"
    # No price is known for the scripted model, and the Hub is told so.
    assert (consumption["cost_usd"], consumption["cost_known"]) == (0.0, False)
    assert state["notifications_read"] == ["n-7"]
    assert [activation["agent_id"] for activation in state["activations"]] == [RESPONDER]

    job = e2e.job("e2e-mention")
    assert job.get_status() is JobStatus.FINISHED
    report = e2e.report("e2e-mention")
    assert job.return_value() == report
    assert report == {
        "task_id": "e2e-mention",
        "agent_id": RESPONDER,
        "type": "notification",
        "outcome": "completed",
        "output": answer,
        "iterations": 2,
        "llm_calls": 2,
        "tool_calls": 1,
        "tokens_input": 300,
        "tokens_output": 55,
        "tokens_cache_read": 0,
        "tokens_cache_write": 0,
        "cost_usd": None,
        "duration_s": report["duration_s"],
        "posted": [comment["id"]],
        "error": None,
        "detail": "",
        "confidence": None,
        "refused_writes": [],
    }
    assert report["duration_s"] > 0
    (completed,) = task_events(run.stderr, "task_completed", "e2e-mention")
    assert (completed["outcome"], completed["agent"]) == ("completed", RESPONDER)
    # The model read the thread, then what the MCP tool fetched from the Hub.
    first, second = e2e.llm.requests(RESPONDER)
    assert "how many rq workers" in "\n".join(user_messages(first))
    (tool_result,) = [m for m in second["body"]["messages"] if m.get("role") == "tool"]
    assert f"[{post_id}]" in str(tool_result["content"])


# --- 2. writing through the hub MCP server -------------------------------------------------


def test_exploration_posts_through_the_hub_tool_as_the_agent(e2e: E2E) -> None:
    e2e.hub.create_post(
        agent_id="bob", title="Queue depth", content="Our workers fall behind.", community="m/e2e"
    )
    e2e.llm.set_scenario(
        EXPLORER,
        [
            {
                "tool_calls": [
                    {
                        "name": "hub__create_post",
                        "arguments": {
                            "title": "Worker round-up",
                            "content": "Three threads about workers this week.",
                            "community": "m/e2e",
                        },
                    }
                ]
            },
            {"text": "I shared a round-up of the worker threads."},
        ],
    )
    # Its own id: the module's mcp-hub (and its log) serves both worker modes of this test.
    task_id = f"e2e-explore-{secrets.token_hex(4)}"
    e2e.enqueue({"task_id": task_id, "type": "exploration", "agent_id": EXPLORER})

    run = e2e.run_burst()

    assert run.returncode == 0, run.stderr
    state = e2e.hub.state()
    (created,) = [post for post in state["posts"] if post["author"]["id"] == EXPLORER]
    assert (created["title"], created["community"]) == ("Worker round-up", "m/e2e")
    report = e2e.report(task_id)
    assert report["outcome"] == "completed"
    assert report["output"] == "I shared a round-up of the worker threads."
    # Only what the tool created: this agent does not post its final text.
    assert report["posted"] == [created["id"]]
    assert (report["tool_calls"], report["llm_calls"]) == (1, 2)
    # The discovery feed reached the model.
    first_request = e2e.llm.requests(EXPLORER)[0]
    assert "Queue depth" in "\n".join(user_messages(first_request))
    # Identity came from the request _meta: the server logged who called, for which task.
    tool_calls = [
        event
        for event in task_events(e2e.process_log("mcp-hub"), "tool_call", task_id)
        if event.get("tool") == "create_post"
    ]
    assert [(event["agent"], event["outcome"]) for event in tool_calls] == [(EXPLORER, "ok")]
    # The write carried the tool call's idempotency key: a replay creates nothing.
    key = f"{task_id}:tool:1:1"
    assert key in state["idempotency_keys"]
    replayed = e2e.hub.create_post(
        agent_id=EXPLORER, content="a retried tool call", idempotency_key=key
    )
    after = e2e.hub.state()
    assert replayed["id"] == created["id"]
    assert (len(after["posts"]), after["replays"]) == (len(state["posts"]), state["replays"] + 1)


# --- 3. and 4. tasks and jobs that must fail alone -----------------------------------------


def test_unknown_agent_and_malformed_tasks_fail_alone_and_the_next_task_runs(e2e: E2E) -> None:
    post_id = mention(e2e, "are you there?")
    e2e.llm.set_scenario(RESPONDER, [{"text": "Still here."}])
    e2e.enqueue({**notification("e2e-unknown-agent", post_id), "agent_id": "e2e-nobody"})
    # The Hub side may write anything: these bypass enqueue_task's validation.
    e2e.enqueue_raw(
        JOB_FUNCTION,
        {"task_id": "e2e-no-post", "type": "notification", "agent_id": RESPONDER},
        job_id="e2e-no-post",
    )
    e2e.enqueue_raw(
        JOB_FUNCTION,
        {"task_id": "e2e-wrong-type", "type": "gossip", "agent_id": RESPONDER},
        job_id="e2e-wrong-type",
    )
    e2e.enqueue(notification("e2e-after", post_id))

    run = e2e.run_burst()

    assert run.returncode == 0, run.stderr
    failing = {
        "e2e-unknown-agent": "unknown agent 'e2e-nobody'",
        "e2e-no-post": "post_id is required for notification tasks",
        "e2e-wrong-type": "type: Input should be 'notification' or 'exploration'",
    }
    failed_ids = FailedJobRegistry("agents", connection=e2e.redis).get_job_ids()
    assert sorted(failed_ids) == sorted(failing)
    for task_id, reason in failing.items():
        assert e2e.job(task_id).get_status() is JobStatus.FAILED, task_id
        report = e2e.report(task_id)
        assert report["outcome"] == "invalid_task", task_id
        assert reason in report["error"]["message"], report
        assert f"task {task_id} invalid_task" in e2e.failure_text(task_id)
        assert len(task_events(run.stderr, "task_completed", task_id)) == 1, task_id
        assert len(task_events(run.stderr, "task_failed", task_id)) == 1, task_id
    state = e2e.hub.state()
    # No agent is known for any of them: ERRORS_AGENT_ID (default agent-worker) reports.
    posted = {post["title"]: post for post in error_posts(state)}
    assert sorted(posted) == sorted(f"invalid_task: task {task_id}" for task_id in failing)
    assert {post["author"]["id"] for post in posted.values()} == {"agent-worker"}
    assert "unknown agent 'e2e-nobody'" in posted["invalid_task: task e2e-unknown-agent"]["content"]
    # The next task in the same burst ran, and it alone reached the model and the Hub.
    assert e2e.report("e2e-after")["outcome"] == "completed"
    assert [(c["post_id"], c["content"]) for c in state["comments"]] == [(post_id, "Still here.")]
    assert [record["activation_id"] for record in state["consumption"]] == ["e2e-after"]
    assert len(e2e.llm.requests()) == 1


def test_jobs_naming_foreign_functions_or_garbage_are_refused_unrun(
    e2e: E2E, tmp_path: Path
) -> None:
    # os.makedirs rather than os.getcwd: had it run, it would have left a trace.
    marker = tmp_path / "made-by-a-foreign-job"
    e2e.enqueue_raw("os.makedirs", str(marker), job_id="e2e-foreign")
    garbage = e2e.enqueue_raw(JOB_FUNCTION, {"task_id": "x"}, job_id="e2e-garbage")
    e2e.redis.hset(garbage.key, "data", zlib.compress(b"\x00\xff not a JSON call"))
    post_id = mention(e2e, "one more question")
    e2e.llm.set_scenario(RESPONDER, [{"text": "Answered."}])
    e2e.enqueue(notification("e2e-after", post_id))

    run = e2e.run_burst()

    assert run.returncode == 0, run.stderr
    failed_ids = FailedJobRegistry("agents", connection=e2e.redis).get_job_ids()
    assert sorted(failed_ids) == ["e2e-foreign", "e2e-garbage"]
    assert e2e.failure_text("e2e-foreign") == (
        f"job function 'os.makedirs' is not allowed; this worker runs only {JOB_FUNCTION}"
    )
    assert "JSONSerializer" in e2e.failure_text("e2e-garbage")
    assert [event["job_id"] for event in run.events("job_refused")] == ["e2e-foreign"]
    assert [event["job_id"] for event in run.events("job_undecodable")] == ["e2e-garbage"]
    # Nothing of theirs ran: no side effect, no task started.
    assert not marker.exists()
    assert [event["task"] for event in run.events("task_started")] == ["e2e-after"]
    assert e2e.job("e2e-after").get_status() is JobStatus.FINISHED
    assert e2e.report("e2e-after")["outcome"] == "completed"


# --- 5. metrics of a long-running worker ---------------------------------------------------


def test_metrics_count_tasks_by_outcome_and_the_worker_stops_warm(e2e: E2E) -> None:
    post_id = mention(e2e, "metrics please")
    e2e.llm.set_scenario(RESPONDER, [{"text": "Here you go."}])
    e2e.llm.set_scenario(EXPLORER, [{"text": "Nothing to add today."}])
    expected = {
        (RESPONDER, "notification", "completed"): 1.0,
        (EXPLORER, "exploration", "completed"): 1.0,
        # An agent that does not exist is no label of its own: one series for all of them.
        ("invalid", "notification", "invalid_task"): 1.0,
    }

    with e2e.worker(METRICS_PORT=str(free_port())) as worker:
        started = worker.wait_for_event("worker_started", timeout_s=60)
        metrics_url = f"http://127.0.0.1:{started['metrics_port']}"
        e2e.enqueue(notification("e2e-metrics-1", post_id))
        e2e.enqueue({"task_id": "e2e-metrics-2", "type": "exploration", "agent_id": EXPLORER})
        e2e.enqueue({**notification("e2e-metrics-3", post_id), "agent_id": "e2e-nobody"})

        # The job processes' counts reach the parent once each job process has ended.
        def scrape_once_all_counted() -> str | None:
            exposition = http_get(f"{metrics_url}/metrics")[1]
            return exposition if sum(tasks_total(exposition).values()) >= 3 else None

        exposition = wait_until(scrape_once_all_counted, 90, "three tasks counted in /metrics")
        assert exposition is not None
        health_status, _ = http_get(f"{metrics_url}/healthz")
        returncode = worker.stop()

    assert tasks_total(exposition) == expected
    assert health_status == 200
    assert returncode == 0, worker.stderr
    assert len(worker.events("worker_stopped")) == 1
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    responder_calls = frozenset({"provider": "openai", "model": RESPONDER, "status": "ok"}.items())
    assert samples[("agent_llm_calls_total", responder_calls)] == 1.0
    # The invalid task's m/agent-errors post.
    assert samples[("agent_errors_posted_total", frozenset())] == 1.0
    promtool = find_promtool()
    if promtool is None:
        pytest.skip(f"{PROMTOOL_MISSING}; only the promtool lint of /metrics was skipped")
    lint = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


# --- 6. operators reach running tasks ------------------------------------------------------


def test_cancel_and_steer_reach_running_tasks(e2e: E2E) -> None:
    # Far more than either task gets through before the operator's command lands, however
    # long that command takes to start (seconds on a busy machine): one turn a second.
    scripted_turns = 45
    steering = "Please keep the answer under fifty words."
    e2e.llm.set_scenario("e2e-cancel", searches(scripted_turns, delay_s=1.0))
    e2e.llm.set_scenario("e2e-steer", searches(scripted_turns, delay_s=1.0))
    # A [[scenario:NAME]] marker in the thread picks each task's script.
    cancel_post = mention(e2e, "[[scenario:e2e-cancel]] a long question")
    steer_post = mention(e2e, "[[scenario:e2e-steer]] another long question")
    e2e.enqueue(notification("e2e-cancel", cancel_post))
    e2e.enqueue(notification("e2e-steer", steer_post))

    with e2e.worker(burst=True) as worker:
        wait_until(lambda: e2e.llm.requests("e2e-cancel"), 90, "the first task's first model call")
        cancelled = e2e.agent_worker_cli("cancel", "e2e-cancel")
        wait_until(lambda: e2e.llm.requests("e2e-steer"), 90, "the second task's first model call")
        steered = e2e.agent_worker_cli("steer", "e2e-steer", steering)
        wait_until(
            lambda: any(steering in user_messages(r) for r in e2e.llm.requests("e2e-steer")),
            60,
            "the steering text in a model request",
        )
        # Heard: let the steered task finish with its next answer.
        e2e.llm.set_scenario("e2e-steer", [{"text": "Short answer, as asked."}])
        returncode = worker.wait(120)

    assert returncode == 0, worker.stderr
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled
    assert steered.returncode == 0 and "message queued" in steered.stdout, steered

    cancel_report = e2e.report("e2e-cancel")
    assert cancel_report["outcome"] == "cancelled"
    assert e2e.job("e2e-cancel").get_status() is JobStatus.FINISHED
    cancel_requests = e2e.llm.requests("e2e-cancel")
    assert cancel_report["llm_calls"] == len(cancel_requests) < scripted_turns

    steer_requests = e2e.llm.requests("e2e-steer")
    assert steering not in user_messages(steer_requests[0])
    assert e2e.report("e2e-steer")["outcome"] == "completed"
    # The steering text arrives once, as a user message, and stays in the conversation.
    carrying = [r for r in steer_requests if steering in user_messages(r)]
    assert carrying == steer_requests[len(steer_requests) - len(carrying) :]
    assert all(user_messages(r).count(steering) == 1 for r in carrying)

    comments = {c["post_id"]: c["content"] for c in e2e.hub.state()["comments"]}
    assert comments == {steer_post: "Short answer, as asked."}


# --- 7. and 8. the provider and the budget -------------------------------------------------


def test_unavailable_provider_requeues_then_gives_up(e2e: E2E) -> None:
    post_id = mention(e2e, "[[scenario:e2e-unavailable]] anyone home?")
    overloaded = {"status": 503, "error": {"message": "overloaded"}}
    # One attempt and one retry per run, two runs.
    e2e.llm.set_scenario("e2e-unavailable", [overloaded] * 4)
    e2e.enqueue(notification("e2e-unavailable", post_id))
    settings = {"LLM_MAX_RETRIES": "1", "REQUEUE_DELAY_S": "1", "REQUEUE_MAX_ATTEMPTS": "1"}

    first = e2e.run_burst(**settings)

    assert first.returncode == 0, first.stderr
    assert e2e.job("e2e-unavailable").get_status() is JobStatus.SCHEDULED
    assert e2e.last_result("e2e-unavailable")["outcome"] == "requeued"
    (requeued,) = task_events(first.stderr, "task_requeued", "e2e-unavailable")
    assert requeued["attempt"] == 1
    assert len(e2e.llm.requests("e2e-unavailable")) == 2
    assert error_posts(e2e.hub.state()) == []
    due = e2e.redis.zscore(ScheduledJobRegistry.key_template.format("agents"), "e2e-unavailable")
    assert due is not None
    wait_until(lambda: time.time() >= due, 30, "the requeued task to be due")

    second = e2e.run_burst(**settings)

    assert second.returncode == 0, second.stderr
    assert e2e.job("e2e-unavailable").get_status() is JobStatus.FAILED
    assert FailedJobRegistry("agents", connection=e2e.redis).get_job_ids() == ["e2e-unavailable"]
    report = e2e.report("e2e-unavailable")
    assert report["outcome"] == "model_error"
    assert "gave up after 1 requeue(s)" in report["error"]["message"]
    assert "gave up after 1 requeue(s)" in e2e.failure_text("e2e-unavailable")
    assert len(e2e.llm.requests("e2e-unavailable")) == 4
    state = e2e.hub.state()
    (error_post,) = error_posts(state)
    assert error_post["author"]["id"] == RESPONDER
    assert "model_error" in error_post["content"]
    assert "gave up after 1 requeue(s)" in error_post["content"]
    assert state["comments"] == []
    assert [record["outcome"] for record in state["consumption"]] == ["model_error"]
    completed = [
        event["outcome"]
        for event in task_events(first.stderr + second.stderr, "task_completed", "e2e-unavailable")
    ]
    assert completed == ["requeued", "model_error"]


def test_unhealthy_budget_ends_the_task_before_any_model_call(e2e: E2E) -> None:
    post_id = mention(e2e, "expensive question")
    e2e.llm.set_scenario(RESPONDER, [{"text": "This must never be asked for."}])
    e2e.hub.set_budget(RESPONDER, healthy=False)
    e2e.enqueue(notification("e2e-broke", post_id))

    run = e2e.run_burst()

    assert run.returncode == 0, run.stderr
    assert e2e.job("e2e-broke").get_status() is JobStatus.FINISHED
    report = e2e.report("e2e-broke")
    assert report["outcome"] == "budget_unhealthy"
    assert (report["llm_calls"], report["posted"], report["error"]) == (0, [], None)
    assert e2e.llm.requests() == []
    assert e2e.llm.stats()["requests"] == 0
    state = e2e.hub.state()
    assert state["comments"] == []
    assert [record["outcome"] for record in state["consumption"]] == ["budget_unhealthy"]


# --- provider SDKs: preloaded for the agents found at start, imported by a task otherwise -----


def write_native_agent(agents_dir: Path, name: str, provider: str) -> None:
    brain = {"provider": provider, "model": name}
    write_agent(agents_dir, name, {"name": name, "type": "native", "brain": brain})


def test_an_agent_of_a_provider_the_worker_did_not_preload_still_runs(
    e2e: E2E, tmp_path: Path
) -> None:
    # At start the worker finds only an openai agent, so it preloads only the openai SDK;
    # an anthropic agent added afterwards imports its SDK in its own task.
    write_native_agent(tmp_path, "e2e-openai-only", "openai")
    answer = "Answered through the Messages API."
    e2e.llm.set_scenario("e2e-late-anthropic", [{"text": answer}])

    with e2e.worker(AGENTS_DIR=str(tmp_path)) as worker:
        wait_until(lambda: worker.events("worker_started"), 90, "the worker to start")
        write_native_agent(tmp_path, "e2e-late-anthropic", "anthropic")
        post = e2e.hub.create_post(agent_id="alice", content="Hey @e2e-late-anthropic, hello")
        task = {
            "task_id": "e2e-late-anthropic",
            "type": "notification",
            "agent_id": "e2e-late-anthropic",
            "post_id": post["id"],
        }
        assert e2e.enqueue(task) == "enqueued"
        wait_until(lambda: e2e.hub.state()["comments"], 90, "the anthropic agent's reply")

    assert e2e.report("e2e-late-anthropic")["outcome"] == "completed"
    (comment,) = e2e.hub.state()["comments"]
    assert comment["content"] == answer
    (request,) = e2e.llm.requests("e2e-late-anthropic")
    assert request["path"] == "/v1/messages"
