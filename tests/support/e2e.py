"""The whole worker end to end: a real stack, a real ``rq worker agents``, nothing faked.

``worker.dev.devstack.running_stack`` starts the devhub, our MCP servers and the
scripted model endpoint once per test module; ``E2E`` drives one test on it:
``reset()`` empties Redis, the devhub and the endpoint, the test seeds the Hub
and scripts the model, enqueues tasks, runs the worker (selected only by
environment variables, as an operator would) and reads back what the devhub,
rq and the worker's stderr show. Agent definitions live in ``AGENTS_DIR``
(tests/support/agents): each agent's model name is its scenario.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import redis
from rq import Queue
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from tests.support.redis_server import free_port
from tests.support.scripted_llm import ScriptedLlm
from tests.support.workers import QUEUE, BurstRun, RunningWorker, launch_worker, parse_events
from worker.dev.devstack import DevStack, ManagedProcess
from worker.enqueue import enqueue_task
from worker.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENTS_DIR = Path(__file__).resolve().parent / "agents"
BIN = Path(sys.executable).parent
AGENT_WORKER = str(BIN / "agent-worker")
BURST_TIMEOUT_S = 120.0

# Variables of the test runner's own environment that would change what the worker does.
_WORKER_VARIABLES = frozenset(
    {name.upper() for name in Settings.model_fields} | {"RQ_WORKER_CLASS", "RQ_REDIS_URL"}
)


class DevHubControl:
    """The devhub of a stack, seen from the test: seed it, read its state, set budgets."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self._client = httpx2.Client(
            base_url=f"{base_url}/api/v1",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=10,
            trust_env=False,
        )

    def state(self) -> dict[str, Any]:
        """Everything the devhub holds (``GET /_dev/state``)."""
        answer: dict[str, Any] = self._call("GET", "/_dev/state")
        return answer

    def reset(self) -> None:
        self._call("POST", "/_dev/reset")

    def set_budget(self, agent_id: str, **overrides: Any) -> None:
        """What budget-health answers for the agent, e.g. ``healthy=False``."""
        self._call("POST", "/_dev/budget", json={"agent_id": agent_id, **overrides})

    def register_agent(self, agent_id: str, *, name: str) -> None:
        """An account ``agent_id`` whose display name is ``name`` (any text it chose)."""
        self._call("POST", "/_dev/agents", json={"id": agent_id, "name": name})

    def create_post(
        self,
        *,
        agent_id: str,
        content: str,
        title: str | None = None,
        community: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """``POST /posts`` as the Hub API has it (an Idempotency-Key makes it replay-safe)."""
        body = {"agent_id": agent_id, "content": content, "title": title, "community": community}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        answer: dict[str, Any] = self._call(
            "POST", "/posts", json={k: v for k, v in body.items() if v is not None}, headers=headers
        )
        return answer

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        response = self._client.request(method, path, json=json, headers=dict(headers or {}))
        if response.status_code >= 400:
            raise AssertionError(
                f"{method} {path} answered {response.status_code}: {response.text}"
            )
        return response.json()


@dataclass
class E2E:
    """One test's handle on the module's stack."""

    stack: DevStack
    redis: redis.Redis
    hub: DevHubControl
    llm: ScriptedLlm

    @classmethod
    @contextlib.contextmanager
    def on(cls, stack: DevStack) -> Iterator[E2E]:
        """Everything reset before the test; the clients closed after it."""
        if stack.llm_base_url is None:
            raise ValueError("the end-to-end tests need the stack's scripted model endpoint")
        e2e = cls(
            stack=stack,
            redis=redis.Redis.from_url(stack.redis_url),
            hub=DevHubControl(stack.hub_url, stack.hub_api_key),
            llm=ScriptedLlm(stack.llm_base_url),
        )
        try:
            e2e.reset()
            yield e2e
        finally:
            e2e.redis.close()
            e2e.hub.close()

    def reset(self) -> None:
        self.redis.flushall()
        self.hub.reset()
        self.llm.reset()

    # -- tasks and jobs ------------------------------------------------------------------------

    def enqueue(self, task: Mapping[str, Any]) -> str:
        """Enqueue through the production path (``worker.enqueue_task``); returns its status."""
        return enqueue_task(self.redis, task).status

    def enqueue_raw(self, function: str, *args: Any, job_id: str) -> Job:
        """A job written by rq's own ``Queue.enqueue``, bypassing every check of ours."""
        queue = Queue(QUEUE, connection=self.redis, serializer=JSONSerializer)
        return queue.enqueue(function, *args, job_id=job_id)

    def job(self, job_id: str) -> Job:
        return Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)

    def report(self, task_id: str) -> dict[str, Any]:
        """The AgentReport the task's last run left in ``job.meta["report"]``."""
        report = self.job(task_id).get_meta(refresh=True).get("report")
        assert isinstance(report, dict), f"task {task_id} has no report in its job meta"
        return report

    def last_result(self, job_id: str) -> Any:
        """What the job's latest successful run returned (kept by rq even after a requeue)."""
        result = Result.fetch_latest(self.job(job_id), serializer=JSONSerializer)
        assert result is not None and result.type is Result.Type.SUCCESSFUL, f"{job_id}: {result}"
        return result.return_value

    def failure_text(self, job_id: str) -> str:
        """The reason rq recorded for a failed job."""
        result = Result.fetch_latest(self.job(job_id), serializer=JSONSerializer)
        assert result is not None and result.exc_string is not None, f"{job_id} did not fail"
        return result.exc_string

    # -- worker processes ----------------------------------------------------------------------

    def worker_env(self, **extra: str) -> dict[str, str]:
        """This environment without any worker setting of its own, plus the stack's."""
        base = {k: v for k, v in os.environ.items() if k.upper() not in _WORKER_VARIABLES}
        return {
            **base,
            **self.stack.worker_env(
                **{"AGENTS_DIR": str(AGENTS_DIR), "METRICS_PORT": str(free_port()), **extra}
            ),
        }

    def run_burst(self, **extra_env: str) -> BurstRun:
        """``rq worker agents --burst`` until the queue is empty."""
        with self.worker(burst=True, **extra_env) as worker:
            worker.wait(BURST_TIMEOUT_S)
        return BurstRun(returncode=worker.process.returncode, stderr=worker.stderr)

    @contextlib.contextmanager
    def worker(self, *, burst: bool = False, **extra_env: str) -> Iterator[AgentWorkerProcess]:
        """``rq worker agents`` in the background; stopped (SIGTERM) when the block ends."""
        with tempfile.TemporaryDirectory(prefix="e2e-worker-") as workdir:
            stderr_path = Path(workdir) / "stderr.log"
            with stderr_path.open("wb") as stderr:
                process = launch_worker(self.worker_env(**extra_env), stderr=stderr, burst=burst)
            worker = AgentWorkerProcess(process=process, stderr_path=stderr_path)
            try:
                yield worker
            finally:
                worker.stop()
                worker.final_stderr = worker.stderr

    def agent_worker_cli(self, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        """The real ``agent-worker`` command, pointed at the stack's Redis."""
        return subprocess.run(
            [AGENT_WORKER, *args],
            cwd=REPO_ROOT,
            env=self.worker_env(**extra_env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def process_log(self, name: str) -> str:
        """What one of the stack's processes (``mcp-hub``, ``devhub``, ...) logged so far."""
        process: ManagedProcess = next(p for p in self.stack.processes if p.name == name)
        assert process.log_path is not None
        return process.log_path.read_text(errors="replace")


class AgentWorkerProcess(RunningWorker):
    """A worker subprocess in its own session: ``stop`` ends the whole group."""

    def wait(self, timeout_s: float) -> int:
        """Wait for a burst worker to finish by itself."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill_group()
            raise AssertionError(
                f"the worker did not finish within {timeout_s} s:\n{self.stderr[-3000:]}"
            ) from None

    def stop(self, timeout_s: float = 30) -> int:
        returncode = super().stop(timeout_s)
        self._kill_group()  # a job process left behind by a killed parent (trap 9)
        return returncode

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def task_events(stderr: str, name: str, task_id: str) -> list[dict[str, Any]]:
    """The worker's log events ``name`` about one task."""
    return [
        event
        for event in parse_events(stderr, name)
        if task_id in (event.get("task"), event.get("task_id"), event.get("job_id"))
    ]


def user_messages(request: Mapping[str, Any]) -> list[str]:
    """The text of each user message of one recorded OpenAI chat request."""
    texts = []
    for message in request["body"]["messages"]:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        texts.append(str(content))
    return texts
