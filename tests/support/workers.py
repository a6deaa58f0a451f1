"""Real ``rq worker`` subprocesses for integration tests, set up only by environment variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

from worker.daemon import AgentWorker

REPO_ROOT = Path(__file__).resolve().parents[2]
RQ = str(Path(sys.executable).parent / "rq")
AGENT_WORKER = str(Path(sys.executable).parent / "agent-worker")
QUEUE = "agents"
WORKER_CLASS = "tests.support.workers.TestAgentWorker"
# Set (to a number above 1) to run every worker the tests start with WORKER_CONCURRENCY:
# `make test` runs the worker end-to-end and chaos tests a second time so.
TEST_CONCURRENCY_VARIABLE = "AGENT_TEST_WORKER_CONCURRENCY"

T = TypeVar("T")


class TestAgentWorker(AgentWorker):
    """AgentWorker that may also run the job functions of tests.support.jobs."""

    __test__ = False  # not a pytest test class
    allowed_functions: ClassVar[frozenset[str]] = AgentWorker.allowed_functions | {
        "tests.support.jobs.echo_task",
        "tests.support.jobs.fail_as_invalid",
        "tests.support.jobs.fail",
        "tests.support.jobs.record_metrics",
        "tests.support.jobs.spawn_child",
        "tests.support.jobs.ask_requeue",
        "tests.support.jobs.use_pooled_server",
        "tests.support.jobs.share_id_with_another_run",
        "tests.support.jobs.spin",
        "tests.support.jobs.block_in_native_code",
        "tests.support.jobs.crash_in_native_code",
        "tests.support.jobs.pause",
        "tests.support.jobs.finish_once_handed_back",
    }


def with_test_concurrency(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with WORKER_CONCURRENCY from AGENT_TEST_WORKER_CONCURRENCY, unless a test set it."""
    concurrency = os.environ.get(TEST_CONCURRENCY_VARIABLE)
    if not concurrency or "WORKER_CONCURRENCY" in env:
        return dict(env)
    return {**env, "WORKER_CONCURRENCY": concurrency}


def rq_worker_command(*args: str, burst: bool = False) -> list[str]:
    """The production command, ``rq worker agents [args]``, with ``--burst`` when asked."""
    return [RQ, "worker", QUEUE, *args, *(["--burst"] if burst else [])]


def launch_worker(
    env: Mapping[str, str],
    *args: str,
    stderr: IO[bytes],
    burst: bool = False,
    cwd: Path = REPO_ROOT,
) -> subprocess.Popen[bytes]:
    """Start ``rq worker agents [args]`` with exactly ``env``; its JSON log goes to ``stderr``.

    The process gets its own session, so that cleaning up can also reach a job process it
    forked (``os.killpg``). Every test that needs a worker in the background starts it here.
    """
    return _in_own_session(
        rq_worker_command(*args, burst=burst), with_test_concurrency(env), stderr, cwd
    )


def launch_pool(
    env: Mapping[str, str], *args: str, stderr: IO[bytes], cwd: Path = REPO_ROOT
) -> subprocess.Popen[bytes]:
    """Start ``agent-worker pool [args]`` with exactly ``env``, as ``launch_worker`` does."""
    return _in_own_session([AGENT_WORKER, "pool", *args], dict(env), stderr, cwd)


def _in_own_session(
    command: list[str], env: dict[str, str], stderr: IO[bytes], cwd: Path
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


def run_burst(
    env: Mapping[str, str], *args: str, timeout_s: float, cwd: Path = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    """``rq worker agents --burst [args]`` with exactly ``env``, until the queue is empty."""
    return subprocess.run(
        rq_worker_command(*args, burst=True),
        cwd=cwd,
        env=with_test_concurrency(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def worker_env(redis_url: str, *, metrics_port: int = 0) -> dict[str, str]:
    """The environment an operator sets: worker class, Redis URL, metrics port."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"RQ_WORKER_CLASS", "RQ_REDIS_URL", "REDIS_URL", "METRICS_PORT"}
    }
    env.update(
        RQ_WORKER_CLASS=WORKER_CLASS,
        RQ_REDIS_URL=redis_url,
        REDIS_URL=redis_url,
        METRICS_PORT=str(metrics_port),
        PYTHONPATH=str(REPO_ROOT),
    )
    # The worker refuses to start without its definitions directory.
    env.setdefault("AGENTS_DIR", str(REPO_ROOT / "tests" / "support" / "agents"))
    return env


@dataclass
class BurstRun:
    returncode: int
    stderr: str

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return parse_events(self.stderr, name)


def run_burst_worker(redis_url: str, *, timeout_s: float = 100) -> BurstRun:
    """``rq worker agents --burst`` until the queue is empty (a bound, generous for a loaded
    machine running the suite in parallel)."""
    completed = run_burst(worker_env(redis_url), timeout_s=timeout_s)
    return BurstRun(returncode=completed.returncode, stderr=completed.stderr)


@dataclass
class RunningWorker:
    process: subprocess.Popen[bytes]
    stderr_path: Path
    # What the worker wrote, kept once it stopped and its log file is gone.
    final_stderr: str | None = None

    @property
    def stderr(self) -> str:
        if self.final_stderr is not None:
            return self.final_stderr
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return parse_events(self.stderr, name)

    def wait_for_event(self, name: str, timeout_s: float = 90) -> dict[str, Any]:
        found = wait_until(lambda: self.events(name), timeout_s, f"event {name}")
        return found[0]

    def stop(self, timeout_s: float = 30) -> int:
        """Warm shutdown with SIGTERM, as systemd or docker stop would do."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@contextmanager
def running_worker(redis_url: str, *, metrics_port: int = 0) -> Iterator[RunningWorker]:
    """A long-running ``rq worker agents``, stopped with SIGTERM on exit."""
    with tempfile.TemporaryDirectory(prefix="test-worker-") as workdir:
        stderr_path = Path(workdir) / "stderr.log"
        with stderr_path.open("wb") as stderr_file:
            process = launch_worker(
                worker_env(redis_url, metrics_port=metrics_port), stderr=stderr_file
            )
        worker = RunningWorker(process=process, stderr_path=stderr_path)
        try:
            worker.wait_for_event("worker_started")
            yield worker
        finally:
            worker.stop()
            worker.final_stderr = worker.stderr


def parse_events(stderr: str, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON log events in a worker's stderr, optionally only those named ``name``."""
    events = []
    for line in stderr.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and (name is None or event.get("event") == name):
            events.append(event)
    return events


def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll ``condition`` until it returns something truthy (a wait, not a speed check)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def blocked_signals(pid: int, tid: int) -> set[signal.Signals]:
    """The signals thread ``tid`` of process ``pid`` blocks, as the kernel reports them."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    (mask,) = [line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")]
    return {sig for sig in signal.Signals if int(mask, 16) & (1 << (sig - 1))}
