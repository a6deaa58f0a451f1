"""Hand-written job hashes against a real worker: a zlib bomb, a broken ``meta.attempt``, and
a producer's own ``meta.requeue``/``meta.report``. Each fails (or is ignored) alone and
visibly, once, and the worker goes on serving."""

from __future__ import annotations

import contextlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import ChaosStack, WorkerProcess, unique
from worker.enqueue import enqueue_task

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

# The size of the bomb in the issue; it expands about a thousand times.
BOMB_BYTES = 509 * 1024
# The worker parent's peak memory stays in the range of a worker that never met the bomb
# (~150 MB here); expanding it would take more than 500 MB.
PEAK_RSS_LIMIT_KB = 400 * 1024


def zlib_bomb(compressed_bytes: int) -> bytes:
    compressor = zlib.compressobj(9)
    chunk = b"\0" * 1_048_576
    bomb = b""
    while len(bomb) < compressed_bytes:
        bomb += compressor.compress(chunk)
    return bomb + compressor.flush()


def hand_written_job(chaos: ChaosStack, prefix: str, **fields: bytes | str) -> str:
    """A valid task enqueued as ours, then hash fields overwritten the way a producer might."""
    task_id = unique(prefix)
    post_id = chaos.seed_post(f"Nobody should answer this [[scenario:{task_id}]]")
    task = {
        "task_id": task_id,
        "type": "notification",
        "agent_id": "chaos-agent",
        "post_id": post_id,
    }
    with contextlib.closing(chaos.connection()) as connection:
        assert enqueue_task(connection, task).status == "enqueued"
        for name, value in fields.items():
            connection.hset(f"rq:job:{task_id}", name, value)
    return task_id


def peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for process {pid}")


def events_about(worker: WorkerProcess, name: str, task_id: str) -> list[dict[str, Any]]:
    return [
        event
        for event in worker.events(name)
        if task_id in (event.get("task"), event.get("job_id"), event.get("task_id"))
    ]


def test_a_zlib_bomb_fails_alone_and_the_worker_never_expands_it(chaos: ChaosStack) -> None:
    bomb = zlib_bomb(BOMB_BYTES)
    assert len(bomb) >= BOMB_BYTES
    bomb_id = hand_written_job(chaos, "bomb", data=bomb)
    good_id = chaos.notification("after-bomb", [{"text": "Still serving"}])
    worker = chaos.start_worker()

    assert chaos.wait_for_status(good_id, timeout_s=90) == "finished"
    assert chaos.wait_for_status(bomb_id, timeout_s=30) == "failed"

    assert "JOB_DATA_MAX_BYTES" in chaos.failure_reason(bomb_id)
    (undecodable,) = events_about(worker, "job_undecodable", bomb_id)
    assert "decompresses to more than" in undecodable["reason"]
    assert events_about(worker, "task_started", bomb_id) == []
    assert worker.alive()
    assert peak_rss_kb(worker.pid) < PEAK_RSS_LIMIT_KB


@pytest.mark.parametrize("raw_meta", ['{"attempt": "first"}', '{"attempt": 1e999}'])
def test_a_broken_meta_attempt_fails_the_task_once_with_a_reason(
    chaos: ChaosStack, raw_meta: str
) -> None:
    broken_id = hand_written_job(chaos, "meta", meta=raw_meta)
    good_id = chaos.notification("after-meta", [{"text": "Still serving"}])
    worker = chaos.start_worker()

    assert chaos.wait_for_status(good_id, timeout_s=90) == "finished"
    assert chaos.wait_for_status(broken_id, timeout_s=30) == "failed"

    assert "meta.attempt" in chaos.failure_reason(broken_id)
    assert len(events_about(worker, "job_undecodable", broken_id)) == 1
    assert events_about(worker, "task_started", broken_id) == []
    # Failed once, for good: not retried, not re-enqueued.
    assert broken_id not in [e.get("task_id") for e in worker.events("task_reenqueued")]
    assert chaos.status(broken_id) == "failed"


def test_a_producer_written_requeue_and_report_are_ignored(chaos: ChaosStack) -> None:
    task_id = chaos.notification("requeue", [{"text": "Answered once", "delay_s": 3}])
    forged = {
        "attempt": 0,
        "requeue": {"delay_s": 0, "attempt": 0},
        "report": {"outcome": "completed", "output": "forged"},
    }
    with contextlib.closing(chaos.connection()) as connection:
        connection.hset(f"rq:job:{task_id}", "meta", json.dumps(forged))
    worker = chaos.start_worker()

    report = chaos.wait_for_outcome(task_id)
    # One worker runs one job after the other: once the next task finished, the worker
    # had long acted on whatever requeue it believed in (it would run at once, delay 0).
    next_id = chaos.notification("after-requeue", [{"text": "Next"}])
    assert chaos.wait_for_status(next_id, timeout_s=90) == "finished"

    assert report["outcome"] == "completed" and report["output"] == "Answered once"
    assert len(events_about(worker, "task_started", task_id)) == 1
    assert len(events_about(worker, "task_completed", task_id)) == 1
    assert events_about(worker, "task_reenqueued", task_id) == []
    (cleared,) = worker.events("job_meta_cleared")
    assert sorted(cleared["fields"]) == ["report", "requeue"]
    post_id = chaos.job(task_id).args[0]["post_id"]
    assert [r["content"] for r in chaos.replies_to(post_id)] == ["Answered once"]
    assert len(chaos.consumption_of(task_id)) == 1
