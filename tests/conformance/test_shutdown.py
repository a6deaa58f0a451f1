"""Warm and cold shutdown by real signals: a cold shutdown hands a job back and the run it
took it from settles nothing; SIGTERM is heard even while stderr is back-pressured."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import termios
import threading
import time

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.chaos.harness import ChaosStack
from tests.conformance.rq_api import run_one_job, runs_of
from tests.support.workers import WORKER_CLASS, launch_worker

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

F_SETPIPE_SZ = 1031  # Linux fcntl: a pipe's buffer size
PIPE_BYTES = 4096


def test_cold_shutdown_hands_the_job_back_and_its_old_run_settles_nothing(
    chaos: ChaosStack,
) -> None:
    # Its first run returns as soon as the job is no longer started: handed back.
    worker, job_id = run_one_job(chaos, "finish_once_handed_back", retries=2)

    worker.send(signal.SIGTERM)
    time.sleep(1.5)  # rq ignores a second signal within a second
    worker.send(signal.SIGTERM)
    worker.wait_exit(60)

    # Back in the queue for its next run, and the old run wrote no result of its own.
    assert chaos.status(job_id) == "queued"
    with contextlib.closing(chaos.connection()) as connection:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        assert [result.type.name for result in job.results()] == []

    chaos.run_burst("--job-monitoring-interval", "1", RQ_WORKER_CLASS=WORKER_CLASS)
    assert chaos.status(job_id) == "finished"
    assert runs_of(chaos, job_id) == 2
    with contextlib.closing(chaos.connection()) as connection:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        assert [result.type.name for result in job.results()] == ["SUCCESSFUL"]
        assert job.return_value() == {"task": job.args[0], "run": 2}


def test_sigterm_stops_a_worker_whose_stderr_is_back_pressured(chaos: ChaosStack) -> None:
    # A pipe nobody reads for a while (a stalled log shipper): the worker blocks writing a
    # log line, and the signal handler runs inside that write.
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, PIPE_BYTES)
    env = chaos.worker_env(RQ_WORKER_CLASS=WORKER_CLASS, LOG_LEVEL="DEBUG", PYTHONFAULTHANDLER="1")
    with os.fdopen(write_fd, "wb") as write_end:
        process = launch_worker(
            env, "--logging_level", "DEBUG", "--maintenance-interval", "1", stderr=write_end
        )
    try:
        # Read until the worker serves (its loop logs at each wake-up), then stop reading.
        _read_until(read_fd, b"dequeueing jobs", timeout_s=120)
        _wait_until_full(read_fd)

        process.send_signal(signal.SIGTERM)
        time.sleep(2)
        output: list[bytes] = []
        drained = threading.Thread(target=_drain, args=(read_fd, output), daemon=True)
        drained.start()
        try:
            returncode = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            returncode = None
            process.send_signal(signal.SIGABRT)
            time.sleep(3)
        assert returncode == 0, b"".join(output)[-3000:].decode(errors="replace")
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        os.close(read_fd)


def _read_until(fd: int, marker: bytes, *, timeout_s: float) -> None:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while marker not in seen:
        assert time.monotonic() < deadline, f"the worker never logged {marker!r}"
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"the worker closed its stderr: {seen[-2000:]!r}"
            seen += chunk


def _wait_until_full(fd: int) -> None:
    """Until the unread bytes stop growing near the pipe's size: the writer is blocked."""

    def unread() -> int:
        size = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, size)
        return int.from_bytes(size, "little")

    last, steady_since = -1, time.monotonic()
    while True:
        current = unread()
        if current != last:
            last, steady_since = current, time.monotonic()
        elif current > PIPE_BYTES // 2 and time.monotonic() - steady_since > 3:
            return
        assert time.monotonic() - steady_since < 120, "the worker stopped logging"
        time.sleep(0.2)


def _drain(fd: int, output: list[bytes]) -> None:
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            output.append(chunk)
