"""rq's job timeout: a job past it never stays started, whether its job process is killed
or its thread (rq's timer exception cannot reach native code) is cancelled and given up;
and a timeout names the job's own limit."""

from __future__ import annotations

import signal

import pytest

from tests.chaos.harness import ChaosStack, concurrent_workers
from tests.conformance.rq_api import (
    TIMEOUT_GRACE_S,
    enqueue_job,
    expired_started_entries,
    run_one_job,
    runs_of,
)
from tests.support.workers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def test_a_job_stuck_in_native_code_past_its_timeout_does_not_stay_started(
    chaos: ChaosStack,
) -> None:
    worker, job_id = run_one_job(chaos, "block_in_native_code", max_duration_s=1)

    expired_while_running: list[str] = []

    def ended() -> bool:
        expired_while_running.extend(expired_started_entries(chaos))
        return chaos.status(job_id) != "started"

    # Fork: rq's alarm ends it at its timeout. Thread: cancelled one grace later, handed
    # back one more grace later.
    wait_until(ended, 60 + 3 * TIMEOUT_GRACE_S, "the job to leave started")
    assert expired_while_running == []  # no heartbeat ever wrote a score in the past
    assert chaos.wait_for_status(job_id, ("failed",), timeout_s=30) == "failed"
    assert runs_of(chaos, job_id) == 1
    if concurrent_workers():
        # Its thread is still blocked: the worker takes no more work and exits for its
        # supervisor to start a clean process.
        assert worker.wait_exit(60) == 1
        assert [e["task_id"] for e in worker.events("job_thread_abandoned")] == [job_id]
        assert "past its timeout" in chaos.failure_reason(job_id)
    else:
        assert "Task exceeded maximum timeout value" in chaos.failure_reason(job_id)
        assert worker.alive()
    assert expired_started_entries(chaos) == []
    assert chaos.status(job_id) == "failed"


def test_a_warm_shutdown_does_not_wait_forever_for_a_job_stuck_in_native_code(
    chaos: ChaosStack,
) -> None:
    worker, job_id = run_one_job(chaos, "block_in_native_code", max_duration_s=1)

    worker.send(signal.SIGTERM)

    assert worker.wait_exit(60 + 3 * TIMEOUT_GRACE_S) in (0, 1)
    assert chaos.status(job_id) == "failed"


def test_a_timeout_names_the_jobs_own_limit(chaos: ChaosStack) -> None:
    worker, short = run_one_job(chaos, "spin", max_duration_s=1)
    # Started while the first still runs (in a thread beside it, or after it in a process).
    longer = enqueue_job(chaos, "pause", max_duration_s=40, meta={"pause_s": 1})

    assert chaos.wait_for_status(short, ("failed",), timeout_s=60) == "failed"
    short_timeout = 1 + TIMEOUT_GRACE_S
    reason = chaos.failure_reason(short)
    assert f"Task exceeded maximum timeout value ({short_timeout} seconds)" in reason, reason
    assert chaos.wait_for_status(longer, timeout_s=60) == "finished"
    assert worker.alive()
