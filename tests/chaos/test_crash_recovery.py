"""Killed job processes, killed workers, warm and cold shutdowns: the task is re-run once,
resumes from its checkpoint, and the Hub sees every effect exactly once."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.chaos.crash_family import (
    assert_everything_happened_once,
    side_effect_then_slow,
    wait_for_side_effect,
)
from tests.chaos.harness import (
    ChaosStack,
    concurrent_workers,
    crash_recovery_args,
    crash_recovery_env,
    parent_pid,
    pid_alive,
    worker_pid_of,
)
from tests.support.workers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


def test_killed_job_process_is_rerun_from_its_checkpoint(chaos: ChaosStack) -> None:
    # A worker running its tasks in threads has no job process to kill: killing the process
    # that runs the task kills the worker (test_concurrent.py: every task in flight re-runs).
    if concurrent_workers():
        pytest.skip("no job process: see test_concurrent.py")
    worker = chaos.start_worker()
    marker = "horse-kill"
    task_id = chaos.notification("horse", side_effect_then_slow(marker))
    wait_for_side_effect(chaos, marker)
    chaos.wait_for_model_requests(task_id, 2)
    horse = chaos.lease_holder_pid(task_id)
    assert horse is not None and parent_pid(horse) == worker.pid

    os.kill(horse, signal.SIGKILL)

    assert_everything_happened_once(chaos, task_id, marker)
    assert len(chaos.llm.requests(task_id)) == 3
    assert worker.alive()
    started = [e for e in worker.events("task_started") if e["task"] == task_id]
    completed = [e for e in worker.events("task_completed") if e["task"] == task_id]
    assert len(started) == 2 and len(completed) == 1


def test_killed_worker_leaves_the_task_to_another_worker_without_two_copies(
    chaos: ChaosStack,
) -> None:
    workers = chaos.start_workers(2, *crash_recovery_args(), **crash_recovery_env())
    marker = "parent-kill"
    search = {"name": "hub__search_posts", "arguments": {"query": "chaos"}}
    task_id = chaos.notification("parent", side_effect_then_slow(marker, second_call=search))
    wait_for_side_effect(chaos, marker)
    chaos.wait_for_model_requests(task_id, 2)
    horse = chaos.lease_holder_pid(task_id)
    assert horse is not None
    (doomed,) = [w for w in workers if w.pid == worker_pid_of(horse)]
    (survivor,) = [w for w in workers if w is not doomed]

    os.kill(doomed.pid, signal.SIGKILL)

    # The orphaned job process finishes the step it is in, sees its worker gone at the
    # next step boundary and stops, leaving the rest to the surviving worker. A task run
    # in a thread of the worker dies with it, mid-step.
    wait_until(lambda: not pid_alive(horse), 60, "the orphaned job process to stop")
    assert_everything_happened_once(chaos, task_id, marker)
    assert len(chaos.llm.requests(task_id)) == 3
    orphan_tools = [e for e in doomed.events("tool_call") if e["task"] == task_id]
    orphan_steps = ["hub__create_post"] + ([] if concurrent_workers() else ["hub__search_posts"])
    assert [e["tool"] for e in orphan_tools] == orphan_steps
    assert [e for e in survivor.events("tool_call") if e["task"] == task_id] == []
    # Never two copies at once: the survivor began after the orphan's last step.
    (rerun,) = [e for e in survivor.events("task_started") if e["task"] == task_id]
    assert rerun["ts"] > orphan_tools[-1]["ts"]
    assert [e["task"] for e in survivor.events("task_completed")] == [task_id]
    assert doomed.events("task_completed") == []
    if not concurrent_workers():
        assert any("WorkerLost" in str(e.get("message")) for e in doomed.events("rq_log"))


def test_warm_shutdown_finishes_the_task_then_exits_0(chaos: ChaosStack) -> None:
    worker = chaos.start_worker()
    task_id = chaos.notification("warm", [{"text": "Finished despite SIGTERM", "delay_s": 4}])
    chaos.wait_for_model_requests(task_id, 1)

    worker.send(signal.SIGTERM)

    assert worker.wait_exit(60) == 0
    (asked,) = [e for e in worker.events("rq_log") if "warm shut down" in e["message"]]
    (completed,) = worker.events("task_completed")
    assert asked["ts"] < completed["ts"]  # the signal came mid-task
    assert chaos.status(task_id) == "finished"
    assert chaos.report(task_id)["outcome"] == "completed"
    post_id = chaos.job(task_id).args[0]["post_id"]
    assert [r["content"] for r in chaos.replies_to(post_id)] == ["Finished despite SIGTERM"]
    assert len(chaos.consumption_of(task_id)) == 1


def test_cold_shutdown_hands_the_task_back_and_it_resumes_elsewhere(chaos: ChaosStack) -> None:
    workers = chaos.start_workers(2)
    marker = "cold"
    task_id = chaos.notification("cold", side_effect_then_slow(marker))
    wait_for_side_effect(chaos, marker)
    chaos.wait_for_model_requests(task_id, 2)
    horse = chaos.lease_holder_pid(task_id)
    assert horse is not None
    (stopping,) = [w for w in workers if w.pid == worker_pid_of(horse)]
    (replacement,) = [w for w in workers if w is not stopping]

    stopping.send(signal.SIGTERM)
    time.sleep(1.5)  # rq ignores a second signal within 1 s of the first
    stopping.send(signal.SIGTERM)

    stopping.wait_exit(60)
    assert not pid_alive(horse)
    # Handed back at once, not left for the abandoned-job cleanup a minute or more later.
    (handed_back,) = stopping.events("task_handed_back")
    assert handed_back["task_id"] == task_id
    assert_everything_happened_once(chaos, task_id, marker)
    assert len(chaos.llm.requests(task_id)) == 3
    assert [e["task"] for e in replacement.events("task_completed")] == [task_id]
