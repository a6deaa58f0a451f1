"""rq's retries and abandoned-job recovery, and what a crash in one job's native code
costs: its own job process in a forking worker; every task of a concurrent worker, which
rq's abandoned-job recovery re-runs once the worker's supervisor started it again."""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos.harness import ChaosStack, concurrent_workers, crash_recovery_args
from tests.conformance.rq_api import enqueue_job, runs_of, start_test_worker, wait_for_runs

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(400)]


def test_rq_retries_a_failing_job_at_once_until_its_retries_run_out(chaos: ChaosStack) -> None:
    worker = start_test_worker(chaos)
    job_id = enqueue_job(chaos, "fail", retries=2)

    assert chaos.wait_for_status(job_id, ("failed",), timeout_s=60) == "failed"
    assert runs_of(chaos, job_id) == 3
    assert "this job always fails" in chaos.failure_reason(job_id)
    assert worker.alive()


def test_a_native_crash_in_one_job_and_how_its_neighbours_come_back(chaos: ChaosStack) -> None:
    args = crash_recovery_args()
    worker = start_test_worker(chaos, *args)
    neighbour = enqueue_job(chaos, "pause", retries=2, meta={"pause_s": 8})
    wait_for_runs(chaos, neighbour, 1)
    crasher = enqueue_job(chaos, "crash_in_native_code")
    wait_for_runs(chaos, crasher, 1)

    if concurrent_workers():
        # The abort takes the whole process, and the neighbour in flight with it.
        assert worker.wait_exit(60) == -signal.SIGABRT
        crashed_at = time.monotonic()
        # Its supervisor starts it again; rq's maintenance re-runs what died with it once
        # each execution's heartbeat expired.
        replacement = start_test_worker(chaos, *args)
        assert chaos.wait_for_status(neighbour, timeout_s=240) == "finished"
        print(f"neighbour finished again {time.monotonic() - crashed_at:.0f} s after the crash")
        assert runs_of(chaos, neighbour) == 2
        assert replacement.alive()
    else:
        # Only the crashing job's own process died.
        assert chaos.wait_for_status(neighbour, timeout_s=60) == "finished"
        assert runs_of(chaos, neighbour) == 1
        assert worker.alive()
    # A job without retries that died is failed, not run again (rq's abandoned-job rule).
    assert chaos.wait_for_status(crasher, ("failed",), timeout_s=240) == "failed"
    assert runs_of(chaos, crasher) == 1
