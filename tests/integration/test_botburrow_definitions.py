"""Definitions in the public Botburrow format, honoured through the whole worker.

Real parts: redis-server, ``rq worker agents --burst``, the devhub, our hub MCP server and
the scripted model endpoint (the chaos harness). Each agent's model name is its scenario.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import conftest as chaos_fixtures
from tests.chaos.harness import ChaosStack, agent_config, unique
from tests.support.definitions import write_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

chaos_stack = chaos_fixtures.chaos_stack
chaos = chaos_fixtures.chaos

AGENT_WORKER = str(Path(sys.executable).parent / "agent-worker")


def enqueue_with_cli(chaos: ChaosStack, *tasks: dict[str, Any]) -> str:
    """``agent-worker enqueue -``, as a producer in the shell would."""
    done = subprocess.run(
        [AGENT_WORKER, "enqueue", "-"],
        input="\n".join(json.dumps(task) for task in tasks),
        capture_output=True,
        text=True,
        env=chaos.worker_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def comment_call(post_id: str, content: str) -> dict[str, Any]:
    call = {"name": "hub__create_comment", "arguments": {"post_id": post_id, "content": content}}
    return {"tool_calls": [call]}


def test_a_mention_the_agent_does_not_answer_is_skipped_without_a_model_call(
    chaos: ChaosStack,
) -> None:
    write_agent(
        chaos.agents_dir,
        "quiet-agent",
        agent_config("quiet-agent", behavior={"respond_to_mentions": False}),
    )
    post_id = chaos.seed_post("@quiet-agent what do you think?")
    task_id = unique("mention")
    task = {
        "task_id": task_id,
        "type": "notification",
        "agent_id": "quiet-agent",
        "post_id": post_id,
        "notification_id": f"n-{task_id}",
        "notification_type": "mention",
    }
    assert enqueue_with_cli(chaos, task) == f"enqueued {task_id}\n"
    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id)
    assert chaos.status(task_id) == "finished"
    assert report["outcome"] == "skipped"
    assert report["detail"] == (
        "behavior.respond_to_mentions is false: the agent does not answer a mention"
    )
    assert (report["llm_calls"], report["posted"], report["error"]) == (0, [], None)
    assert chaos.llm.requests() == []
    state = chaos.hub_state()
    assert f"n-{task_id}" in state["notifications_read"]
    assert chaos.replies_to(post_id, "quiet-agent") == []
    assert chaos.error_posts_about(task_id) == []


def test_a_third_reply_on_one_thread_is_refused_across_tasks(chaos: ChaosStack) -> None:
    # Three tasks on one thread by an agent allowed two responses there: the first two reply,
    # the third is refused its comment through the tool and then its own reply.
    name = "thread-agent"
    limits = {"max_responses_per_thread": 2, "min_interval_seconds": 0}
    write_agent(chaos.agents_dir, name, agent_config(name, behavior={"limits": limits}))
    post_id = chaos.seed_post("@thread-agent let us discuss")
    chaos.llm.set_scenario(
        "chaos-model",
        [{"text": "One."}, {"text": "Two."}, comment_call(post_id, "Three."), {"text": "Four."}],
    )
    task_ids = [unique("thread-1"), unique("thread-2"), unique("thread-3")]
    reports = []
    for task_id in task_ids:
        task = {"task_id": task_id, "type": "notification", "agent_id": name, "post_id": post_id}
        assert chaos.enqueue(task) == "enqueued"
        # No per-task guard in the way: the thread cap alone must stop the third comment.
        chaos.run_burst(MAX_WRITES_PER_POST="0")
        reports.append(chaos.wait_for_outcome(task_id))

    assert [c["content"] for c in chaos.replies_to(post_id, name)] == ["One.", "Two."]
    assert [r["outcome"] for r in reports] == ["completed"] * 3
    third = reports[2]
    refusal = "you already answered 2 time(s) on the thread of post"
    assert refusal in json.dumps(chaos.llm.requests("chaos-model")[3])  # the model read it
    assert third["posted"] == []
    assert third["error"]["class"] == "WriteCapReached"
    assert refusal in third["error"]["message"]
    assert [chaos.error_posts_about(task_id) for task_id in task_ids] == [[], [], []]


def test_an_official_endpoint_definition_runs_on_the_operators_endpoint(
    chaos: ChaosStack,
) -> None:
    # OPENAI_BASE_URL (the scripted endpoint) stands in for the public endpoint it names.
    name = "official-agent"
    brain = {
        "provider": "openai",
        "model": "official-scenario",
        "api_base": "https://api.openai.com/v1",
        "api_key_env": "OPENAI_API_KEY",
    }
    write_agent(chaos.agents_dir, name, agent_config(name, brain=brain))
    chaos.llm.set_scenario("official-scenario", [{"text": "Hello from the official brain."}])
    post_id = chaos.seed_post("@official-agent hello?")
    task_id = unique("official")
    task = {"task_id": task_id, "type": "notification", "agent_id": name, "post_id": post_id}
    assert chaos.enqueue(task) == "enqueued"
    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id)
    assert report["outcome"] == "completed", report["error"]
    assert len(chaos.llm.requests("official-scenario")) == 1
    assert [c["content"] for c in chaos.replies_to(post_id, name)] == [
        "Hello from the official brain."
    ]


def test_check_json_shows_the_schema_defaults_of_a_definition_that_sets_none(
    tmp_path: Path,
) -> None:
    bare = "name: bare-agent\ntype: native\nbrain: {provider: openai, model: gpt-4o-mini}\n"
    write_agent(tmp_path, "bare-agent", bare)
    env = {
        "PATH": str(Path(sys.executable).parent),
        "AGENTS_DIR": str(tmp_path),
        "REDIS_URL": "redis://127.0.0.1:1/0",  # never reached: --offline
        "OPENAI_API_KEY": "sk-bare-5Tq9Lw2Xe7Rn4Vb1",  # check reports an unset key
    }

    done = subprocess.run(
        [AGENT_WORKER, "check", "--json", "--offline"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    shown = json.loads(done.stdout)["agents"]["bare-agent"]
    assert shown["behavior"]["limits"] == {
        "max_daily_posts": 5,
        "max_daily_comments": 50,
        "max_responses_per_thread": 3,
        "min_interval_seconds": 60,
    }
    assert shown["behavior"]["discovery"]["enabled"] is False
    assert shown["behavior"]["discovery"]["min_confidence"] == 0.7
    assert shown["brain"]["temperature"] == 0.7
    assert shown["capabilities"]["shell"]["timeout_seconds"] == 120
    assert shown["cache_ttl"] == 300


def test_an_exploration_responds_only_at_min_confidence_and_reports_it(chaos: ChaosStack) -> None:
    name = "explorer-agent"
    discovery = {"enabled": True, "respond_to_questions": True, "min_confidence": 0.8}
    write_agent(chaos.agents_dir, name, agent_config(name, behavior={"discovery": discovery}))
    confident = chaos.seed_post("How many workers per core?")
    unsure = chaos.seed_post("Is Redis 8 faster?")

    def answer(post_id: str, confidence: float) -> dict[str, Any]:
        decision = {
            "summary": "Read the feed.",
            "respond_to": post_id,
            "kind": "question",
            "confidence": confidence,
            "response": f"Answer for {post_id}.",
        }
        return {"text": json.dumps(decision)}

    chaos.llm.set_scenario("chaos-model", [answer(confident, 0.8), answer(unsure, 0.79)])
    task_ids = [unique("explore-sure"), unique("explore-unsure")]
    for task_id in task_ids:
        task = {"task_id": task_id, "type": "exploration", "agent_id": name}
        assert chaos.enqueue(task) == "enqueued"
        chaos.run_burst()
    sure, unsure_report = (chaos.wait_for_outcome(task_id) for task_id in task_ids)

    assert [c["content"] for c in chaos.replies_to(confident, name)] == [f"Answer for {confident}."]
    assert chaos.replies_to(unsure, name) == []
    assert (sure["outcome"], sure["confidence"]) == ("completed", 0.8)
    assert sure["detail"] == (
        f"responded to question {confident} at confidence 0.8 (min_confidence 0.8)"
    )
    assert (unsure_report["outcome"], unsure_report["confidence"]) == ("completed", 0.79)
    assert unsure_report["detail"] == (
        f"confidence 0.79 is below min_confidence 0.8: no response to {unsure}"
    )
    # The schema went to the provider with every call.
    response_format = chaos.llm.requests("chaos-model")[0]["body"]["response_format"]
    assert response_format["json_schema"]["name"] == "discovery_answer"
    assert response_format["json_schema"]["strict"] is True
