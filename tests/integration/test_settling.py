"""Settling cannot fail: whatever the Hub answers while a task closes out, the task ends once,
with its report, its task_completed line and its metrics; the Hub's refusals become dead
letters an operator sees (``agent-worker status``) and replays (``agent-worker dead-letters``).

Real parts: redis-server, ``rq worker agents`` processes, the devhub with injected faults,
our MCP servers and the scripted model, from the chaos harness.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.chaos import conftest as chaos_fixtures
from tests.chaos.harness import REPO_ROOT, ChaosStack, WorkerProcess, unique
from tests.support.workers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

chaos_stack = chaos_fixtures.chaos_stack
chaos = chaos_fixtures.chaos

MAINTENANCE_PAGE = "<html><body><h1>Down for maintenance</h1></body></html>"


def answered_notification(
    chaos: ChaosStack, prefix: str, text: str, *, faults: Callable[[], None] = lambda: None
) -> tuple[str, str]:
    """Enqueue a notification (with a notification id) the model answers with ``text``;
    ``faults`` are injected once its post is seeded, before it is enqueued."""
    task_id = unique(prefix)
    chaos.llm.set_scenario(task_id, [{"text": text}])
    post_id = chaos.seed_post(f"@chaos-agent help? [[scenario:{task_id}]]")
    faults()
    task = {
        "task_id": task_id,
        "type": "notification",
        "agent_id": "chaos-agent",
        "post_id": post_id,
        "notification_id": f"n-{task_id}",
    }
    assert chaos.enqueue(task) == "enqueued"
    return task_id, post_id


def cli(chaos: ChaosStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.operations", *args],
        cwd=REPO_ROOT,
        env=chaos.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def dead_letters(chaos: ChaosStack) -> dict[str, dict[str, Any]]:
    listed = cli(chaos, "dead-letters", "list", "--json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    letters = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    return {letter["id"]: letter for letter in letters}


def events_of(worker: WorkerProcess, name: str, task_id: str) -> list[dict[str, Any]]:
    return [event for event in worker.events(name) if event.get("task") == task_id]


def test_hub_refusals_while_settling_end_the_task_once_and_become_replayable_dead_letters(
    chaos: ChaosStack,
) -> None:
    def faults() -> None:
        chaos.hub.inject_faults(401, 1, path_prefix="/api/v1/system/consumption", method="POST")
        chaos.hub.inject_faults(404, 1, path_prefix="/api/v1/notifications/read")

    task_id, post_id = answered_notification(chaos, "refused", "Here is my answer.", faults=faults)

    worker = chaos.run_burst()

    assert chaos.status(task_id) == "finished"
    assert chaos.report(task_id)["outcome"] == "completed"
    assert len(events_of(worker, "task_started", task_id)) == 1  # rq never ran it again
    assert len(events_of(worker, "task_completed", task_id)) == 1
    assert len(chaos.llm.requests(task_id)) == 1
    assert [reply["content"] for reply in chaos.replies_to(post_id)] == ["Here is my answer."]
    assert chaos.consumption_of(task_id) == []
    buried = {event["kind"] for event in worker.events("outbox_dead_letter")}
    assert buried == {"consumption", "notifications_read"}
    letters = dead_letters(chaos)
    assert set(letters) == {f"{task_id}:consumption", f"{task_id}:read"}
    assert letters[f"{task_id}:consumption"]["status"] == 401

    status = json.loads(cli(chaos, "status", "--json").stdout)
    assert status["outbox"]["dead"] == 2
    assert status["outbox"]["newest_dead"]["id"] in letters
    assert "payload" not in status["outbox"]["newest_dead"]
    assert "newest dead letter" in cli(chaos, "status").stdout

    replayed = cli(chaos, "dead-letters", "replay", "--all")
    assert replayed.returncode == 0, replayed.stderr
    assert sorted(replayed.stdout.split()) == sorted(
        [f"{task_id}:consumption:", f"{task_id}:read:", "delivered", "delivered"]
    )
    assert dead_letters(chaos) == {}
    assert len(chaos.consumption_of(task_id)) == 1
    assert f"n-{task_id}" in chaos.hub_state()["notifications_read"]
    assert [reply["content"] for reply in chaos.replies_to(post_id)] == ["Here is my answer."]
    assert all(not chaos.canaries.found_in(sink) for sink in chaos.leak_sinks().values())


def test_a_rejected_error_post_is_dead_lettered_and_the_failed_task_keeps_its_report(
    chaos: ChaosStack,
) -> None:
    task_id = unique("ghost")
    chaos.hub.inject_faults(422, 1, path_prefix="/api/v1/posts", method="POST")
    task = {"task_id": task_id, "type": "exploration", "agent_id": "ghost-agent"}
    assert chaos.enqueue(task) == "enqueued"

    worker = chaos.run_burst()

    assert chaos.status(task_id) == "failed"
    assert chaos.report(task_id)["outcome"] == "invalid_task"
    assert len(events_of(worker, "task_started", task_id)) == 1
    assert len(events_of(worker, "task_completed", task_id)) == 1
    assert chaos.error_posts_about(task_id) == []
    assert set(dead_letters(chaos)) == {f"{task_id}:error"}

    dropped_nothing = cli(chaos, "dead-letters", "drop", "no-such-letter")
    assert dropped_nothing.returncode == 2
    assert "no dead letter 'no-such-letter'" in dropped_nothing.stderr
    assert cli(chaos, "dead-letters", "replay", f"{task_id}:error").returncode == 0
    assert cli(chaos, "dead-letters", "replay", "--all").returncode == 0  # nothing left
    assert len(chaos.error_posts_about(task_id)) == 1


def test_a_maintenance_page_while_settling_parks_everything_until_the_hub_is_back(
    chaos: ChaosStack,
) -> None:
    worker = chaos.start_worker("--maintenance-interval", "2")
    task_id, post_id = answered_notification(
        chaos,
        "maintenance",
        "Answered after all.",
        faults=lambda: chaos.hub.inject_faults(
            200,
            10_000,
            path_prefix="/api/v1",
            method="POST",
            body=MAINTENANCE_PAGE,
            content_type="text/html",
        ),
    )

    assert chaos.wait_for_status(task_id) == "finished"
    assert chaos.report(task_id)["outcome"] == "completed"
    parked = {event["kind"] for event in events_of(worker, "hub_write_parked", task_id)}
    assert parked == {"comment", "consumption", "notifications_read", "activated"}
    assert chaos.replies_to(post_id) == []

    chaos.hub.inject_faults(200, 0)  # the Hub is back
    wait_until(lambda: chaos.outbox_size() == 0, 90, "the outbox to drain")

    assert [reply["content"] for reply in chaos.replies_to(post_id)] == ["Answered after all."]
    assert len(chaos.consumption_of(task_id)) == 1
    assert f"n-{task_id}" in chaos.hub_state()["notifications_read"]
    assert dead_letters(chaos) == {}
    assert len(events_of(worker, "task_completed", task_id)) == 1


def test_a_write_the_hub_answers_without_an_id_is_dead_lettered_alone_after_its_attempts(
    chaos: ChaosStack,
) -> None:
    worker = chaos.start_worker("--maintenance-interval", "1", OUTBOX_MAX_ATTEMPTS="3")
    task_id = unique("no-id")
    chaos.llm.set_scenario(task_id, [{"text": "An answer the Hub mislays."}])
    post_id = chaos.seed_post(f"@chaos-agent help? [[scenario:{task_id}]]")
    chaos.hub.inject_faults(
        201, 10_000, path_prefix=f"/api/v1/posts/{post_id}/comments", method="POST", body="{}"
    )
    task = {"task_id": task_id, "type": "notification", "agent_id": "chaos-agent"}
    assert chaos.enqueue({**task, "post_id": post_id}) == "enqueued"

    assert chaos.wait_for_status(task_id) == "finished"
    wait_until(lambda: dead_letters(chaos) or None, 90, "the reply to be dead-lettered")

    assert set(dead_letters(chaos)) == {f"{task_id}:reply"}
    assert dead_letters(chaos)[f"{task_id}:reply"]["attempts"] == 3
    assert chaos.outbox_size() == 0
    assert len(chaos.consumption_of(task_id)) == 1  # the other writes went through
    assert len(events_of(worker, "task_completed", task_id)) == 1

    chaos.hub.inject_faults(201, 0)
    assert cli(chaos, "dead-letters", "replay", f"{task_id}:reply").returncode == 0
    assert [reply["content"] for reply in chaos.replies_to(post_id)] == [
        "An answer the Hub mislays."
    ]
