"""Each limit at its boundary through a real `rq worker`: the deadline, tokens and cost.

The chaos stack serves them (real Redis, devhub, MCP servers, and a scripted model
endpoint that can delay its answers and report any usage); each test writes its own
agent definition, with the limit under test.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chaos.harness import MODEL, ChaosStack, agent_config, parent_pid, unique, write_agent
from tests.support.workers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

LIMITS_AGENT = "limits-agent"


def limited_agent(chaos: ChaosStack, **limits: Any) -> None:
    # A large brain.max_tokens: what each call may write is then set by the budget alone.
    config = agent_config(
        LIMITS_AGENT, brain={"max_tokens": 8000}, limits={"max_tokens": 200_000, **limits}
    )
    write_agent(chaos.agents_dir, LIMITS_AGENT, config)


def ask(chaos: ChaosStack, prefix: str, turns: Sequence[Mapping[str, Any]], **task: Any) -> str:
    """A post mentioning the limited agent, selecting ``turns``; its task is enqueued."""
    task_id = unique(prefix)
    chaos.llm.set_scenario(task_id, turns)
    post_id = chaos.seed_post(f"@{LIMITS_AGENT} please look [[scenario:{task_id}]]")
    body = {"task_id": task_id, "type": "notification", "agent_id": LIMITS_AGENT}
    assert chaos.enqueue({**body, "post_id": post_id, **task}) == "enqueued"
    return task_id


def events_of(chaos: ChaosStack, name: str, task_id: str) -> list[dict[str, Any]]:
    return [
        event
        for worker in chaos.workers
        for event in worker.events(name)
        if task_id in (event.get("task"), event.get("task_id"))
    ]


def output_caps(chaos: ChaosStack, task_id: str) -> list[int]:
    """The output budget each model request of the task carried."""
    caps = []
    for request in chaos.llm.requests(task_id):
        body = request["body"]
        caps.append(int(body.get("max_completion_tokens") or body.get("max_tokens")))
    return caps


def search_turn(usage: Mapping[str, int] | None, number: int) -> dict[str, Any]:
    call = {"name": "hub__search_posts", "arguments": {"query": f"limits {number}"}}
    turn: dict[str, Any] = {"tool_calls": [call]}
    if usage is not None:
        turn["usage"] = dict(usage)
    return turn


# --- the deadline ----------------------------------------------------------------------------


def test_a_model_call_outliving_the_deadline_ends_deadline_not_requeued(chaos: ChaosStack) -> None:
    limited_agent(chaos, max_duration_s=8)
    turns: list[dict[str, Any]] = [
        {"text": "far too late", "delay_s": 60},
        {"text": "Closing answer."},
    ]
    task_id = ask(chaos, "late", turns)

    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id, timeout_s=60)
    assert report["outcome"] == "deadline", report
    assert chaos.status(task_id) == "finished"
    assert "requeue" not in chaos.job(task_id).meta
    assert len(events_of(chaos, "task_started", task_id)) == 1  # never put back
    assert events_of(chaos, "task_requeued", task_id) == []
    [consumption] = chaos.consumption_of(task_id)
    assert consumption["outcome"] == "deadline"


def test_a_re_run_after_a_crash_continues_against_the_same_deadline(chaos: ChaosStack) -> None:
    limited_agent(chaos, max_duration_s=60)
    turns: list[dict[str, Any]] = [
        {"text": "never delivered", "delay_s": 120},
        {"text": "Answer after the crash."},
    ]
    worker = chaos.start_worker()
    task_id = ask(chaos, "crash", turns)
    wait_until(lambda: chaos.llm.requests(task_id), 60, "the first model request")
    with chaos.connection() as connection:
        fixed = float(connection.get(f"agent-worker:deadline:{task_id}") or 0)
    horse = chaos.lease_holder_pid(task_id)
    assert fixed > 0 and horse is not None and parent_pid(horse) == worker.pid
    time.sleep(1.5)  # so the re-run's rq timeout is visibly shorter than the first run's

    os.kill(horse, signal.SIGKILL)

    report = chaos.wait_for_outcome(task_id, timeout_s=90)
    assert report["outcome"] == "completed", report
    assert len(events_of(chaos, "task_started", task_id)) == 2
    [kept] = events_of(chaos, "task_deadline_kept", task_id)
    assert kept["deadline_epoch"] == pytest.approx(fixed, abs=0.001)
    assert 0 < kept["remaining_s"] < 60
    # rq's hard timeout of the re-run covered only what was left, plus the grace.
    rerun_timeout = chaos.job(task_id).timeout
    assert rerun_timeout is not None and rerun_timeout < 60 + 60


def test_rq_timeout_follows_the_agents_limit_not_a_tasks_looser_one(chaos: ChaosStack) -> None:
    limited_agent(chaos, max_duration_s=20)
    task_id = ask(chaos, "loose", [{"text": "Quick."}], constraints={"max_duration_s": 86_400})
    assert chaos.job(task_id).timeout == 86_400 + 60  # what the producer computed

    chaos.run_burst()

    assert chaos.wait_for_outcome(task_id, timeout_s=60)["outcome"] == "completed"
    assert chaos.job(task_id).timeout == 20 + 60


# --- tokens and cost -------------------------------------------------------------------------


def test_steady_usage_keeps_tokens_within_the_limit(chaos: ChaosStack) -> None:
    limited_agent(chaos, max_tokens=6000)
    # Steady and honest: the output always fits the smallest budget a call is given.
    steady = {"input_tokens": 900, "output_tokens": 30}
    task_id = ask(chaos, "tokens", [search_turn(steady, n) for n in range(8)])

    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id, timeout_s=60)
    assert report["outcome"] == "max_tokens", report
    assert report["tokens_input"] + report["tokens_output"] <= 6000
    assert report["llm_calls"] >= 2
    caps = output_caps(chaos, task_id)
    # Each call was given only what the 6000 leaves after the calls before it and its input.
    assert all(cap + 930 * n < 6000 for n, cap in enumerate(caps))


def test_a_50k_token_jump_ends_max_tokens_not_completed(chaos: ChaosStack) -> None:
    limited_agent(chaos, max_tokens=1000)
    jump = {"text": "Here is everything.", "usage": {"input_tokens": 20, "output_tokens": 50_000}}
    task_id = ask(chaos, "jump", [jump])

    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id, timeout_s=60)
    assert report["outcome"] == "max_tokens", report
    assert report["tokens_output"] == 50_000
    [consumption] = chaos.consumption_of(task_id)
    assert consumption["outcome"] == "max_tokens"


def test_steady_usage_keeps_cost_within_the_budget(chaos: ChaosStack, tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        yaml.safe_dump({"models": {MODEL: {"input_per_mtok": 10.0, "output_per_mtok": 40.0}}}),
        encoding="utf-8",
    )
    limited_agent(chaos, max_cost_usd=0.05)
    # No usage scripted: the endpoint reports what the request really holds (4 characters a
    # token), so each call costs a little more than the last as the conversation grows.
    task_id = ask(chaos, "cost", [search_turn(None, n) for n in range(12)])

    chaos.run_burst(PRICES_FILE=str(prices))

    report = chaos.wait_for_outcome(task_id, timeout_s=60)
    assert report["outcome"] == "budget", report
    assert report["cost_usd"] is not None and report["cost_usd"] <= 0.05
    assert report["llm_calls"] >= 2
