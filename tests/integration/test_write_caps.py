"""Write caps across the fleet: two real workers, two tasks, one daily comment left; a model
that comments on one post again and again, or only repeats the message it was asked; error
posts that no cap holds back.

Real parts: redis-server, ``rq worker agents`` processes, the devhub, our hub MCP server
(the tools' writes) and the scripted model, from the chaos harness.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chaos import conftest as chaos_fixtures
from tests.chaos.harness import ChaosStack, agent_config, scrape_metric, unique
from tests.support.definitions import write_agent
from tests.support.redis_server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

chaos_stack = chaos_fixtures.chaos_stack
chaos = chaos_fixtures.chaos

CAPPED = "capped-agent"
DAILY_LIMIT_TEXT = "Error: daily comment limit (1) reached"


def comment_call(post_id: str, content: str, delay_s: float = 0) -> dict[str, Any]:
    arguments = {"post_id": post_id, "content": content}
    call = {"name": "hub__create_comment", "arguments": arguments}
    return {"tool_calls": [call], "delay_s": delay_s}


def notification_with_tools(
    chaos: ChaosStack, prefix: str, agent_id: str, turns_for: Any
) -> tuple[str, str]:
    """A notification whose scripted turns are built from its post id: (task id, post id)."""
    task_id = unique(prefix)
    post_id = chaos.seed_post(f"@{agent_id} please look [[scenario:{task_id}]]")
    chaos.llm.set_scenario(task_id, turns_for(post_id))
    task = {"task_id": task_id, "type": "notification", "agent_id": agent_id, "post_id": post_id}
    assert chaos.enqueue(task) == "enqueued"
    return task_id, post_id


def agent_comments(chaos: ChaosStack, agent_id: str) -> list[dict[str, Any]]:
    return [c for c in chaos.hub_state()["comments"] if c["author"]["id"] == agent_id]


def model_saw(chaos: ChaosStack, task_id: str, text: str) -> bool:
    return text in json.dumps(chaos.llm.requests(task_id))


def test_two_workers_two_tasks_share_one_daily_comment_cap(chaos: ChaosStack) -> None:
    write_agent(
        chaos.agents_dir,
        CAPPED,
        # No interval: the daily cap alone must hold the second comment back.
        agent_config(
            CAPPED, behavior={"limits": {"max_daily_comments": 1, "min_interval_seconds": 0}}
        ),
    )
    ports = [free_port(), free_port()]
    workers = [chaos.start_worker(METRICS_PORT=str(port)) for port in ports]
    tasks = [
        notification_with_tools(
            chaos,
            f"cap-{n}",
            CAPPED,
            lambda post_id, n=n: [
                comment_call(post_id, f"tool comment {n}", delay_s=2),
                {"text": f"done {n}"},
            ],
        )
        for n in range(2)
    ]
    reports = [chaos.wait_for_outcome(task_id) for task_id, _ in tasks]

    assert [report["outcome"] for report in reports] == ["completed", "completed"]
    # Each worker ran one of them (the model's first answer takes 2 s): two processes, one cap.
    ran = [{e["task"] for e in worker.events("task_started")} for worker in workers]
    assert sorted(len(tasks_run) for tasks_run in ran) == [1, 1]
    assert len(agent_comments(chaos, CAPPED)) == 1  # neither the tool nor the reply got past
    refused = [
        (task_id, report)
        for (task_id, _), report in zip(tasks, reports, strict=True)
        if report["error"] is not None
    ]
    assert len(refused) == 1
    task_id, report = refused[0]
    assert report["error"]["class"] == "WriteCapReached"
    assert "daily comment limit (1) reached" in report["error"]["message"]
    assert report["posted"] == []
    assert model_saw(chaos, task_id, DAILY_LIMIT_TEXT)
    counted = [scrape_metric(port, "agent_hub_writes_refused_total") for port in ports]
    assert sum(value or 0 for value in counted) == 2  # the tool call and the reply


def test_a_model_commenting_again_on_the_same_post_is_stopped_after_the_first(
    chaos: ChaosStack,
) -> None:
    def turns(post_id: str) -> list[dict[str, Any]]:
        return [
            comment_call(post_id, "First thoughts."),
            comment_call(post_id, "Second thoughts, other words."),
            comment_call(post_id, "Third thoughts."),
            {"text": "All said."},
        ]

    task_id, post_id = notification_with_tools(chaos, "same-post", "chaos-agent", turns)
    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id)
    assert report["outcome"] == "completed"
    assert [c["content"] for c in chaos.replies_to(post_id)] == ["First thoughts."]
    assert len(report["posted"]) == 1
    # The reply delivered, the next call was the closing turn, which lists the tools but lets
    # the model call none: its second comment call there is dropped, and the delivered reply
    # stays the task's answer.
    requests = chaos.llm.requests(task_id)
    assert len(requests) == 2 and requests[-1]["body"].get("tool_choice") == "none"
    assert model_saw(chaos, task_id, "Your reply is posted on the Hub")
    assert report["output"] == "First thoughts."


def test_a_comment_that_only_repeats_the_question_is_not_posted_and_the_answer_is(
    chaos: ChaosStack,
) -> None:
    # Qwen2.5-Coder 1.5B, asked "@agent which day did we pick?", called the comment tool
    # with "Which day did we pick?" as its reply; its closing turn then answered.
    def turns(post_id: str) -> list[dict[str, Any]]:
        post = next(p for p in chaos.hub_state()["posts"] if p["id"] == post_id)
        echo = post["content"].replace("@chaos-agent ", "").upper() + " !"
        return [comment_call(post_id, echo), {"text": "We picked Thursday."}]

    task_id, post_id = notification_with_tools(chaos, "echo", "chaos-agent", turns)
    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id)
    assert report["outcome"] == "completed"
    assert [c["content"] for c in chaos.replies_to(post_id)] == ["We picked Thursday."]
    assert model_saw(chaos, task_id, "only repeats what @alice wrote in the thread")
    assert chaos.llm.requests(task_id)[-1]["body"].get("tool_choice") == "none"


def test_error_posts_are_never_capped(chaos: ChaosStack) -> None:
    write_agent(
        chaos.agents_dir,
        CAPPED,
        agent_config(CAPPED, behavior={"limits": {"max_daily_posts": 0, "max_daily_comments": 0}}),
    )
    task_id = unique("cap-error")
    chaos.llm.set_scenario(task_id, [{"status": 401, "error": {"message": "invalid api key"}}])
    post_id = chaos.seed_post(f"@{CAPPED} hi [[scenario:{task_id}]]")
    task = {"task_id": task_id, "type": "notification", "agent_id": CAPPED, "post_id": post_id}
    assert chaos.enqueue(task) == "enqueued"
    chaos.run_burst()

    assert chaos.wait_for_outcome(task_id)["outcome"] == "model_error"
    assert len(chaos.error_posts_about(task_id)) == 1
