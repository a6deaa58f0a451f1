"""The after-job clean-up of a job's child processes takes only that run's, through a real
``rq worker agents`` running jobs in threads (WORKER_CONCURRENCY=2)."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import pytest
import redis
from rq.job import Job
from rq.queue import Queue

from tests.support.jobs import (
    RUNS_KEY,
    SHARED_CHILDREN_KEY,
    SHARED_VERDICT_KEY,
    enqueue_test_job,
    process_running,
)
from tests.support.workers import RunningWorker, launch_worker, wait_until, worker_env

pytestmark = [pytest.mark.integration]


def test_a_runs_clean_up_leaves_the_children_of_another_run_of_the_same_job(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    enqueue_test_job(redis_conn, "shared", "tests.support.jobs.share_id_with_another_run")
    env = {**worker_env(redis_url), "WORKER_CONCURRENCY": "2"}
    with tempfile.TemporaryDirectory(prefix="test-worker-") as workdir:
        stderr_path = Path(workdir) / "stderr.log"
        with stderr_path.open("wb") as stderr_file:
            worker = RunningWorker(
                process=launch_worker(env, stderr=stderr_file), stderr_path=stderr_path
            )
        try:
            wait_until(lambda: redis_conn.hget(RUNS_KEY, "shared"), 60, "the first run")
            # The same id queued again while its first run is in flight, as rq's immediate
            # retry puts it back: the worker starts it in its second job thread.
            redis_conn.rpush(Queue.redis_queue_namespace_prefix + "agents", "shared")
            verdict = wait_until(lambda: redis_conn.get(SHARED_VERDICT_KEY), 120, "the verdict")
            assert verdict == b"alive"
            # The second run's own clean-up takes its child.
            killed = wait_until(
                lambda: len(found := worker.events("child_processes_killed")) == 2 and found,
                60,
                "the second run's clean-up",
            )
            assert sorted(event["pids"][0] for event in killed) == sorted(
                int(pid) for pid in redis_conn.lrange(SHARED_CHILDREN_KEY, 0, -1)
            )
            assert len({event["execution"] for event in killed}) == 2
            assert not any(process_running(pid) for event in killed for pid in event["pids"])
        finally:
            worker.stop()
            for pid in redis_conn.lrange(SHARED_CHILDREN_KEY, 0, -1):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(pid), signal.SIGKILL)
    assert Job.exists("shared", connection=redis_conn)
