"""What the process benchmarks share: the bench agent, seeded tasks, real ``rq worker`` runs.

A bench task is a notification of three steps: the scripted model asks for
``hub__get_thread``, then ``hub__search_posts``, then answers; the worker posts the
answer as a comment and settles on the Hub. Each task's post carries a
``[[scenario:<task id>]]`` marker, so its three turns come from its own queue on
the scripted endpoint even when several workers run tasks at once.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from hub_client import HubClient
from worker.dev.devstack import DevStack, running_stack
from worker.enqueue import enqueue_task

BENCH_AGENT = "bench-agent"
STEPS_PER_TASK = 3
RQ = str(Path(sys.executable).with_name("rq"))
AGENT_WORKER = str(Path(sys.executable).with_name("agent-worker"))
REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_RUN_TIMEOUT_S = 300

_CONFIG = f"""\
name: {BENCH_AGENT}
type: native
brain:
  provider: openai
  model: bench-model
  max_tokens: 500
capabilities:
  grants: [hub:read, hub:write]
  mcp_servers: [hub]
interests:
  communities: [m/general]
behavior:
  max_iterations: 6
  # Many tasks of this one agent run at once in the scaling and in-flight benchmarks.
  max_concurrent: 1000
  # Hundreds of replies in minutes: the public format's default write caps would hold
  # most of them back.
  limits:
    max_daily_posts: 1000000
    max_daily_comments: 1000000
    max_responses_per_thread: 1000000
    min_interval_seconds: 0
limits:
  max_tokens: 100000
  max_duration_s: 120
"""
_SYSTEM_PROMPT = (
    "You are bench-agent. Read the thread you are mentioned in, look for related posts, "
    "then answer in two or three sentences.\n"
)


def has_concurrent_worker() -> bool:
    """Whether this code has ``WORKER_CONCURRENCY`` (several tasks at once in one worker)."""
    from worker.settings import Settings

    return "worker_concurrency" in Settings.model_fields


def write_agents(directory: Path) -> Path:
    """An AGENTS_DIR holding the bench agent; returns it."""
    agent_dir = directory / "agents" / BENCH_AGENT
    agent_dir.mkdir(parents=True, exist_ok=True)
    (agent_dir / "config.yaml").write_text(_CONFIG)
    (agent_dir / "system-prompt.md").write_text(_SYSTEM_PROMPT)
    return directory


def _turns(post_id: str) -> list[dict[str, Any]]:
    usage = {"input_tokens": 900, "output_tokens": 40}
    return [
        {
            "tool_calls": [{"name": "hub__get_thread", "arguments": {"post_id": post_id}}],
            "usage": usage,
        },
        {
            "tool_calls": [{"name": "hub__search_posts", "arguments": {"query": "scaling"}}],
            "usage": usage,
        },
        {
            "text": "Run one `rq worker agents` per core on each host; the task lease keeps "
            "a task from running twice, and Redis is the only thing the hosts share.",
            "usage": usage,
        },
    ]


@dataclass
class BenchStack:
    """A running dev stack plus the bench agent; ``seed`` prepares tasks, workers run them."""

    stack: DevStack
    agents_dir: Path
    redis: redis.Redis
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    _seeded: int = 0

    def worker_env(self, **extra: str) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RQ_", "OPENAI_", "ANTHROPIC_"))
        }
        env.update(
            self.stack.worker_env(
                AGENTS_DIR=str(self.agents_dir),
                METRICS_PORT="0",
                PYTHONPATH=str(REPO_ROOT),
            )
        )
        env.update(extra)
        return env

    def seed(self, count: int) -> list[dict[str, Any]]:
        """Create ``count`` posts mentioning the bench agent, script their turns, enqueue them."""
        tasks = anyio.run(self._seed, count)
        for task in tasks:
            enqueue_task(self.redis, task)
        return tasks

    async def _seed(self, count: int) -> list[dict[str, Any]]:
        assert self.stack.llm_base_url is not None
        tasks = []
        async with (
            HubClient(self.stack.hub_url, self.stack.hub_api_key) as hub,
            httpx2.AsyncClient(base_url=self.stack.llm_base_url, timeout=10.0) as llm,
        ):
            for _ in range(count):
                self._seeded += 1
                task_id = f"bench-{self.run_id}-{self._seeded}"
                post = await hub.create_post(
                    agent_id="alice",
                    title="How do we scale the agent workers?",
                    content=(
                        f"@{BENCH_AGENT} our queue grows at peak hours: how do we scale "
                        f"`rq worker agents` across hosts? [[scenario:{task_id}]]"
                    ),
                    community="m/general",
                    idempotency_key=f"{task_id}:seed",
                )
                answer = await llm.post(
                    "/_scripted/scenarios", json={"name": task_id, "turns": _turns(post.id)}
                )
                answer.raise_for_status()
                tasks.append(
                    {
                        "task_id": task_id,
                        "type": "notification",
                        "agent_id": BENCH_AGENT,
                        "post_id": post.id,
                        "notification_id": f"n-{task_id}",
                    }
                )
        return tasks

    def set_llm_latency(self, latency_s: float) -> None:
        assert self.stack.llm_base_url is not None
        answer = httpx2.post(
            f"{self.stack.llm_base_url}/_scripted/config",
            json={"latency_s": latency_s},
            timeout=10.0,
        )
        answer.raise_for_status()


@contextmanager
def bench_stack(*, llm_latency_s: float = 0.0) -> Iterator[BenchStack]:
    """Start redis-server, the devhub, the MCP servers and the scripted model endpoint."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-agents-") as workdir,
        running_stack(scripted_llm=True, llm_latency_s=llm_latency_s) as stack,
    ):
        connection = redis.Redis.from_url(stack.redis_url)
        try:
            yield BenchStack(stack=stack, agents_dir=write_agents(Path(workdir)), redis=connection)
        finally:
            connection.close()


# -- running workers ------------------------------------------------------------------------


@dataclass
class WorkerRun:
    """One ``rq worker agents --burst`` process: how long it lived and what it logged."""

    returncode: int
    started: float
    finished: float
    events: list[dict[str, Any]]


def run_burst_workers(env: Mapping[str, str], count: int) -> list[WorkerRun]:
    """Start ``count`` burst workers at once and wait until every one has drained the queue."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as logdir:
        processes = []
        started = time.time()
        for index in range(count):
            log = open(Path(logdir) / f"worker-{index}.log", "wb")  # noqa: SIM115
            process = subprocess.Popen(
                [RQ, "worker", "agents", "--burst"],
                cwd=REPO_ROOT,
                env=dict(env),
                stdout=subprocess.DEVNULL,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            processes.append((process, log))
        try:
            for process, log in processes:
                process.wait(timeout=WORKER_RUN_TIMEOUT_S)
                finished = time.time()
                log.close()
                text = Path(log.name).read_text(errors="replace")
                runs.append(WorkerRun(process.returncode, started, finished, parse_events(text)))
        finally:
            for process, log in processes:
                log.close()
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    return runs


@dataclass
class WorkerPool:
    """Long-running ``rq worker agents`` processes started by ``running_workers``."""

    processes: list[subprocess.Popen[bytes]]
    log_paths: list[Path]
    runs: list[WorkerRun] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]


@contextmanager
def running_workers(
    env: Mapping[str, str], count: int, connection: redis.Redis, *, ready_timeout_s: float = 120
) -> Iterator[WorkerPool]:
    """Start ``count`` workers, wait until each has registered with rq, stop them on exit.

    Their events are in ``pool.runs`` after the block: stopping is rq's warm shutdown
    (SIGTERM), so a job still running finishes first.
    """
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as logdir:
        logs = [Path(logdir) / f"worker-{index}.log" for index in range(count)]
        already_registered = connection.scard("rq:workers")
        processes = []
        started = time.time()
        for path in logs:
            with open(path, "wb") as log:
                processes.append(
                    subprocess.Popen(
                        [RQ, "worker", "agents"],
                        cwd=REPO_ROOT,
                        env=dict(env),
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        pool = WorkerPool(processes=processes, log_paths=logs)
        try:
            deadline = time.monotonic() + ready_timeout_s
            while connection.scard("rq:workers") < already_registered + count:
                if any(process.poll() is not None for process in processes):
                    raise RuntimeError("a worker exited at start:\n" + logs[0].read_text()[-2000:])
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{count} workers did not register in {ready_timeout_s} s")
                time.sleep(0.1)
            yield pool
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            for process, path in zip(processes, logs, strict=True):
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                text = path.read_text(errors="replace")
                pool.runs.append(
                    WorkerRun(process.returncode, started, time.time(), parse_events(text))
                )


def wait_for_jobs(connection: redis.Redis, job_ids: Sequence[str], *, timeout_s: float) -> None:
    """Until every job has finished or failed in rq."""
    deadline = time.monotonic() + timeout_s
    keys = [f"rq:job:{job_id}" for job_id in job_ids]
    while True:
        with connection.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "status")
            statuses = pipe.execute()
        if all(status in (b"finished", b"failed") for status in statuses):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs still running after {timeout_s} s")
        time.sleep(0.05)


def parse_events(stderr: str) -> list[dict[str, Any]]:
    events = []
    for line in stderr.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


def event_time(event: Mapping[str, Any]) -> float:
    """The event's timestamp as epoch seconds."""
    return datetime.fromisoformat(str(event["ts"])).timestamp()


@dataclass(frozen=True)
class JobTimes:
    """rq's own timestamps of one job, as epoch seconds."""

    job_id: str
    status: str
    enqueued_at: float
    started_at: float
    ended_at: float
    outcome: str


def job_times(connection: redis.Redis, job_ids: Sequence[str]) -> list[JobTimes]:
    times = []
    for job_id in job_ids:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        if job.enqueued_at is None or job.started_at is None or job.ended_at is None:
            raise RuntimeError(f"job {job_id} did not run to the end ({job.get_status()})")
        report = job.meta.get("report") or {}
        times.append(
            JobTimes(
                job_id=job_id,
                status=str(job.get_status()),
                enqueued_at=job.enqueued_at.timestamp(),
                started_at=job.started_at.timestamp(),
                ended_at=job.ended_at.timestamp(),
                outcome=str(report.get("outcome")),
            )
        )
    return times


def require_completed(times: Sequence[JobTimes]) -> None:
    """A benchmark of failed tasks measures nothing: stop with what went wrong."""
    failed = [t for t in times if t.outcome != "completed"]
    if failed:
        details = ", ".join(f"{t.job_id}: {t.status}/{t.outcome}" for t in failed[:5])
        raise RuntimeError(f"{len(failed)} bench task(s) did not complete: {details}")


def stack_pids(bench: BenchStack) -> dict[str, int]:
    """The stack's server processes by name (redis-server included)."""
    pids = {
        managed.name: managed.process.pid
        for managed in bench.stack.processes
        if managed.process is not None
    }
    pids["redis-server"] = int(bench.redis.info("server")["process_id"])
    return pids
