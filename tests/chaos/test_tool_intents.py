"""Journal before the side effect: a job process killed after a tool wrote on the Hub but
before the result reached its checkpoint. The re-run finds the call's intent, repeats it
with the same idempotency key, and the Hub replays the first answer: one post, one reply.

The window is made exact, not hoped for: the Hub answers the write late (an injected
delay), Redis is paused for writes once the intent is recorded, so the checkpoint cannot
land, and the job process is killed after the post exists. A worker running its tasks
in threads is that process: it is killed, and a second worker re-runs the task.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.chaos.harness import (
    ChaosStack,
    concurrent_workers,
    crash_recovery_args,
    crash_recovery_env,
    pid_alive,
)
from tests.support.workers import wait_until
from worker.redis_io import keys as redis_keys

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

HUB_ANSWER_DELAY_S = 4
PAUSE_MS = 60_000


def side_effect_posts(chaos: ChaosStack, marker: str) -> list[dict[str, object]]:
    return [p for p in chaos.hub_state()["posts"] if f"Side effect {marker}" in p["content"]]


def test_a_crash_between_the_call_and_its_checkpoint_repeats_nothing(chaos: ChaosStack) -> None:
    worker = chaos.start_worker(*crash_recovery_args(), **crash_recovery_env())
    marker = "intent"
    create_post = {
        "name": "hub__create_post",
        "arguments": {"content": f"Side effect {marker}", "community": "m/general"},
    }
    task_id = chaos.notification(
        "intent",
        [{"tool_calls": [create_post], "delay_s": 3}, {"text": f"Final answer {marker}"}],
    )
    wait_until(lambda: chaos.llm.requests(task_id), 60, "the first model request")
    # The Hub takes its time to answer the tool's write (the thread was read already).
    chaos.hub_call(
        "POST",
        "/_dev/faults",
        {"delay_s": HUB_ANSWER_DELAY_S, "count": 1, "path_prefix": "/api/v1/posts"},
    )
    intents_key = redis_keys.checkpoint(task_id) + ":intents"
    with contextlib.closing(chaos.connection()) as connection:
        wait_until(lambda: connection.hget(intents_key, "1:1"), 60, "the call's intent")
        # From here on no write lands: the tool's result never reaches the checkpoint.
        connection.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        try:
            wait_until(lambda: side_effect_posts(chaos, marker), 60, "the tool's post")
            horse = chaos.lease_holder_pid(task_id)
            assert horse is not None
            os.kill(horse, signal.SIGKILL)
            wait_until(lambda: not pid_alive(horse), 30, "the job process to die")
            time.sleep(1)  # Redis drops the dead client's queued write with its connection
            checkpoint = connection.lrange(redis_keys.checkpoint(task_id), 0, -1)
        finally:
            connection.execute_command("CLIENT", "UNPAUSE")

    assert len(checkpoint) == 1  # the model's answer only: the tool's result is not in it
    # The task died with a concurrent worker: another one re-runs it once its execution expired.
    workers = [worker]
    if concurrent_workers():
        workers.append(chaos.start_worker(*crash_recovery_args(), **crash_recovery_env()))
    rerun_within_s = 180 if concurrent_workers() else 120
    assert chaos.wait_for_status(task_id, timeout_s=rerun_within_s) == "finished"
    report = chaos.report(task_id)
    assert report["outcome"] == "completed", report
    assert len(side_effect_posts(chaos, marker)) == 1
    assert chaos.hub_state()["replays"] == 1  # the repeated call, answered from the first
    (in_doubt,) = [e for w in workers for e in w.events("tool_call_in_doubt")]
    assert (in_doubt["task"], in_doubt["tool"]) == (task_id, "hub__create_post")
    post_id = chaos.job(task_id).args[0]["post_id"]
    assert [r["content"] for r in chaos.replies_to(post_id)] == [f"Final answer {marker}"]
    assert len(chaos.consumption_of(task_id)) == 1
    started = [e for w in workers for e in w.events("task_started") if e["task"] == task_id]
    completed = [e for w in workers for e in w.events("task_completed") if e["task"] == task_id]
    assert len(started) == 2 and len(completed) == 1
    assert workers[-1].alive()
