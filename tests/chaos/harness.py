"""The chaos stack: real Redis, devhub, MCP servers, scripted model and `rq worker` processes.

One ``ChaosStack`` serves the whole chaos session (starting its servers costs
seconds); each test gets it flushed and reset. Every secret in it is a canary
(``Canaries``), so any test can scan what the fleet wrote for a leak. Workers are
the production command, ``rq worker agents`` with ``RQ_WORKER_CLASS=worker.AgentWorker``,
each in its own session so a test can kill it like an operator or the OOM killer would.

A task picks its scripted conversation by a ``[[scenario:NAME]]`` marker in the post
it answers (see ``worker.dev.scripted_endpoint``), so tests running one after another
never share a script.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import redis
import yaml
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from tests.support import SERVER_READY_TIMEOUT_S
from tests.support.definitions import write_agent
from tests.support.devhub import DevHub
from tests.support.jobs import process_running
from tests.support.redis_server import RedisServer, free_port, running_redis
from tests.support.scripted_llm import ScriptedLlm, running_scripted_llm
from tests.support.workers import (
    QUEUE,
    TEST_CONCURRENCY_VARIABLE,
    blocked_signals,
    launch_pool,
    launch_worker,
    parse_events,
    wait_until,
)
from worker.dev.devstack import ManagedProcess, python_module
from worker.enqueue import enqueue_task
from worker.memory import MemoryKind, MemoryRecord, Provenance, RedisMemoryStore, memory_id
from worker.redis_io import keys as redis_keys
from worker.tools import PUBLIC

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT = "chaos-agent"
READER = "reader-agent"
KIT_AGENT = "kit-agent"
MODEL = "chaos-model"
# Variables of the developer's shell that must not reach a chaos worker.
_FOREIGN_VARIABLES = (
    "REDIS_URL",
    "RQ_REDIS_URL",
    "RQ_WORKER_CLASS",
    "HUB_URL",
    "HUB_API_KEY",
    "MCP_AUTH_TOKEN",
    "CAPABILITY_KEY",
    "MCP_CONFIG",
    "GRANT_POLICY",
    "AGENTS_DIR",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "GITHUB_TOKEN",
    "METRICS_PORT",
    "METRICS_TEXTFILE",
)
# A task of a killed worker re-runs this long after its next heartbeat was due (rq's 60 s
# otherwise): far above any scheduling delay here, for workers no test cuts off from Redis.
HEARTBEAT_GRACE_S = 20
# Marks every process a chaos worker starts (forked job processes and rq's scheduler
# inherit it), so a test can find and end whatever a killed worker left behind.
STACK_MARKER = "AGENT_WORKER_CHAOS_STACK"
# How long Redis stays down when ``ride_out_redis_restarts`` stops it mid-task.
REDIS_RESTART_OUTAGE_S = 8


@dataclass(frozen=True)
class Canaries:
    """Recognisable fake secrets; none may ever show up in a prompt, log, report or post."""

    openai_api_key: str
    hub_api_key: str
    mcp_auth_token: str
    github_token: str
    # Signs each task's capability; mcp-hub verifies it (the production path).
    capability_key: str
    # Random and shared by all of them: finding it anywhere means (part of) a secret leaked.
    tail: str

    @classmethod
    def fresh(cls) -> Canaries:
        tail = secrets.token_hex(12)
        return cls(
            openai_api_key=f"sk-canary-{tail}",
            hub_api_key=f"canary-hub-{tail}",
            mcp_auth_token=f"canary-mcp-{tail}",
            github_token=f"ghp_canary{tail}",
            capability_key=f"canary-capability-key-{tail}",
            tail=tail,
        )

    def found_in(self, content: bytes) -> bool:
        return self.tail.encode() in content


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class WorkerProcess:
    """One ``rq worker agents`` process; its stderr (JSON log lines) is kept in a file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stderr(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return parse_events(self.stderr, name)

    def wait_for_event(
        self,
        name: str,
        timeout_s: float = 30,
        where: Callable[[dict[str, Any]], bool] = lambda event: True,
    ) -> dict[str, Any]:
        found = wait_until(
            lambda: [event for event in self.events(name) if where(event)],
            timeout_s,
            f"event {name} from worker {self.pid}",
        )
        return found[0]

    def send(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def send_to_a_thread(self, sig: signal.Signals) -> None:
        """``sig`` to one of the worker's threads other than the main one that does not block
        it, as the kernel may hand a signal sent to the process to any such thread that is
        running (tgkill(2))."""
        threads = sorted(int(tid) for tid in os.listdir(f"/proc/{self.pid}/task"))
        (tid, *_) = [
            tid for tid in threads if tid != self.pid and sig not in blocked_signals(self.pid, tid)
        ]
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.tgkill(self.pid, tid, sig) != 0:
            raise OSError(ctypes.get_errno(), f"tgkill {self.pid} {tid} {sig.name}")

    def wait_exit(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Warm shutdown, then the whole process group (rq's scheduler is in it)."""
        if self.alive():
            self.send(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@dataclass
class ChaosStack:
    redis_server: RedisServer
    hub: DevHub
    llm: ScriptedLlm
    mcp_servers: list[ManagedProcess]
    workdir: Path
    agents_dir: Path
    mcp_config: Path
    canaries: Canaries
    stack_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    workers: list[WorkerProcess] = field(default_factory=list)

    # -- Redis and jobs ----------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return self.redis_server.url

    def connection(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def enqueue(self, task: Mapping[str, Any], *, delay_s: float = 0) -> str:
        with contextlib.closing(self.connection()) as connection:
            return enqueue_task(connection, task, delay_s=delay_s).status

    def job(self, task_id: str) -> Job:
        with contextlib.closing(self.connection()) as connection:
            return Job.fetch(task_id, connection=connection, serializer=JSONSerializer)

    def status(self, task_id: str) -> str | None:
        with contextlib.closing(self.connection()) as connection:
            raw = connection.hget(f"rq:job:{task_id}", "status")
        return raw.decode() if isinstance(raw, bytes) else None

    def report(self, task_id: str) -> dict[str, Any]:
        report = self.job(task_id).meta.get("report")
        assert isinstance(report, dict), f"task {task_id} has no report"
        return report

    def failure_reason(self, task_id: str) -> str:
        """What rq's failed registry says about a job: its latest result's exception text."""
        with contextlib.closing(self.connection()) as connection:
            try:
                job = Job.fetch(task_id, connection=connection, serializer=JSONSerializer)
                result = Result.fetch_latest(job, serializer=JSONSerializer)
            except Exception:  # a hash rq cannot load: the worker wrote the reason into it
                result = None
            if result is not None and result.exc_string:
                return result.exc_string
            raw = connection.hget(f"rq:job:{task_id}", "exc_info")
        return raw.decode(errors="replace") if isinstance(raw, bytes) else ""

    def wait_for_status(
        self, task_id: str, statuses: Sequence[str] = ("finished", "failed"), timeout_s: float = 60
    ) -> str:
        def arrived() -> str | None:
            status = self.status(task_id)
            return status if status in statuses else None

        return wait_until(arrived, timeout_s, f"task {task_id} to be {' or '.join(statuses)}")

    def wait_for_model_requests(self, task_id: str, count: int, timeout_s: float = 60) -> None:
        """Until the model endpoint has seen ``count`` requests of the task's scenario."""
        wait_until(
            lambda: len(self.llm.requests(task_id)) >= count, timeout_s, f"{count} model requests"
        )

    def wait_for_outcome(self, task_id: str, timeout_s: float = 90) -> dict[str, Any]:
        """The task's final report: a run that ended for good, not one that was requeued."""

        def final_report() -> dict[str, Any] | None:
            if self.status(task_id) not in ("finished", "failed"):
                return None
            report = self.job(task_id).meta.get("report")
            if not isinstance(report, dict) or report.get("outcome") == "requeued":
                return None
            return report

        return wait_until(final_report, timeout_s, f"task {task_id} to end for good")

    def lease_holder_pid(self, task_id: str) -> int | None:
        """The pid of the process running the task: the job process holding its lease
        (``host:pid``), or the concurrent worker process running it in a thread
        (``host:pid/run``)."""
        with contextlib.closing(self.connection()) as connection:
            holder = connection.get(redis_keys.task_lease(task_id))
        if not isinstance(holder, bytes):
            return None
        return int(holder.decode().rpartition(":")[2].partition("/")[0])

    def restart_redis_while_the_scheduler_renews_its_lock(self) -> None:
        """Restart Redis with rq's scheduler inside its heartbeat, which renews its lock.

        The heartbeat is one transaction (MULTI, HSET, EXPIRE, the lock script by its
        SHA, EXEC) that redis-py sends after asking the server whether it has the
        script. With writes paused (``CLIENT PAUSE ... WRITE``) the question is answered
        and the transaction waits in the server at its HSET; restarted there, the
        transaction's retry reaches a server that has never seen the script.
        """
        with contextlib.closing(self.connection()) as admin:
            assert admin.exists(f"rq:scheduler-lock:{QUEUE}"), "no scheduler holds its lock"
            admin.client_pause(60_000, all=False)
            wait_until(
                lambda: any(_renewing_the_scheduler_lock(c) for c in admin.client_list()),
                30,
                "rq's scheduler to renew its lock",
            )
        self.redis_server.start_again()

    def outbox_size(self) -> int:
        with contextlib.closing(self.connection()) as connection:
            return int(connection.zcard(redis_keys.OUTBOX))

    # -- the Hub -----------------------------------------------------------------------------

    def hub_call(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx2.request(
            method,
            f"{self.hub.url}/api/v1{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.canaries.hub_api_key}"},
            timeout=10,
            trust_env=False,
        )
        response.raise_for_status()
        return response.json()

    def hub_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.hub_call("GET", "/_dev/state")
        return state

    def seed_post(self, content: str, *, author: str = "alice", title: str = "Help?") -> str:
        """A post on the Hub, as a human would write it; returns its id."""
        created = self.hub_call(
            "POST",
            "/posts",
            {"agent_id": author, "content": content, "title": title, "community": "m/general"},
        )
        return str(created["id"])

    def notification(
        self, prefix: str, turns: Sequence[Mapping[str, Any]], *, delay_s: float = 0
    ) -> str:
        """Script a conversation, seed a post that selects it, enqueue a task answering it
        (``delay_s``: into rq's scheduled registry, for rq's scheduler to move to the queue)."""
        task_id = unique(prefix)
        self.llm.set_scenario(task_id, turns)
        post_id = self.seed_post(f"@{AGENT} can you help? [[scenario:{task_id}]]")
        task = {"task_id": task_id, "type": "notification", "agent_id": AGENT, "post_id": post_id}
        assert self.enqueue(task, delay_s=delay_s) == ("scheduled" if delay_s else "enqueued")
        return task_id

    def replies_to(self, post_id: str, agent_id: str = AGENT) -> list[dict[str, Any]]:
        return [
            comment
            for comment in self.hub_state()["comments"]
            if comment["post_id"] == post_id and comment["author"]["id"] == agent_id
        ]

    def consumption_of(self, task_id: str) -> list[dict[str, Any]]:
        return [c for c in self.hub_state()["consumption"] if c["activation_id"] == task_id]

    def error_posts_about(self, task_id: str) -> list[dict[str, Any]]:
        return [
            post
            for post in self.hub_state()["posts"]
            if post.get("community") == "m/agent-errors"
            and (post.get("title") or "").endswith(f"task {task_id}")
        ]

    # -- workers -----------------------------------------------------------------------------

    def worker_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_VARIABLES}
        env.update(
            {
                STACK_MARKER: self.stack_id,
                "PYTHONPATH": str(REPO_ROOT),
                "RQ_WORKER_CLASS": "worker.AgentWorker",
                "REDIS_URL": self.redis_url,
                "HUB_URL": self.hub.url,
                "HUB_API_KEY": self.canaries.hub_api_key,
                "MCP_AUTH_TOKEN": self.canaries.mcp_auth_token,
                "CAPABILITY_KEY": self.canaries.capability_key,
                "MCP_CONFIG": str(self.mcp_config),
                "AGENTS_DIR": str(self.agents_dir),
                "OPENAI_BASE_URL": self.llm.openai_base_url,
                "OPENAI_API_KEY": self.canaries.openai_api_key,
                "METRICS_PORT": "0",
                # A re-run waiting for a dead copy's lease, or a busy agent, comes back soon.
                "BUSY_WAIT_S": "2",
                "BUSY_REQUEUE_DELAY_S": "2",
                # Definitions change between tests; never serve a cached one.
                "AGENT_CACHE_TTL_S": "0",
            }
        )
        env.update(extra)
        return env

    def start_worker(self, *args: str, **env: str) -> WorkerProcess:
        """``rq worker agents [args]`` in its own session; waits until it serves."""
        (worker,) = self.start_workers(1, *args, **env)
        return worker

    def start_workers(self, count: int, *args: str, **env: str) -> list[WorkerProcess]:
        """``count`` workers started side by side (each spends seconds importing)."""
        started = [self._launch_worker(args, env) for _ in range(count)]
        if "--burst" not in args:
            for worker in started:
                worker.wait_for_event("worker_started", timeout_s=90)
        return started

    def _launch_worker(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        launch: Callable[..., subprocess.Popen[bytes]] = launch_worker,
    ) -> WorkerProcess:
        log_path = self.workdir / f"worker-{len(self.workers) + 1}-{unique('log')}.log"
        with log_path.open("wb") as log:
            process = launch(self.worker_env(**env), *args, stderr=log)
        worker = WorkerProcess(process=process, log_path=log_path)
        self.workers.append(worker)
        return worker

    def start_pool(self, *args: str, **env: str) -> WorkerProcess:
        """``agent-worker pool [args]`` in its own session; waits until each worker serves."""
        pool = self._launch_worker(args, env, launch=launch_pool)
        if "--burst" not in args:
            pool.wait_for_event("pool_started", timeout_s=90)
            processes = int(pool.events("pool_started")[0]["processes"])
            wait_until(
                lambda: len(pool.events("worker_started")) >= processes,
                90,
                f"{processes} workers of pool {pool.pid} to start",
            )
        return pool

    def run_burst(self, *args: str, timeout_s: float = 120, **env: str) -> WorkerProcess:
        """``rq worker agents --burst``: serves until the queue is empty, then exits."""
        worker = self.start_worker("--burst", *args, **env)
        worker.wait_exit(timeout_s)
        return worker

    def end_workers(self) -> None:
        """Stop every worker of this test and anything its killed workers left running."""
        for worker in self.workers:
            if worker.alive():
                worker.send(signal.SIGTERM)  # all at once: each takes a moment to stop
        for worker in self.workers:
            worker.stop()
        self.workers.clear()
        kill_marked_processes(self.stack_id)

    # -- where a secret could leak -----------------------------------------------------------

    def leak_sinks(self) -> dict[str, bytes]:
        """Everything the fleet wrote that a secret must never reach, by where it is."""
        sinks = {
            "prompts sent to the model": json.dumps(self.llm.requests()).encode(),
            "Hub state (posts, comments, consumption)": json.dumps(self.hub_state()).encode(),
            "devhub log": self.hub.stderr_text().encode(),
            "Redis (jobs, reports, failures, checkpoints, outbox)": self.redis_dump(),
        }
        for worker in self.workers:
            sinks[f"worker log {worker.log_path.name}"] = worker.log_path.read_bytes()
        for server in self.mcp_servers:
            if server.log_path is not None:
                sinks[f"{server.name} log"] = server.log_path.read_bytes()
        return sinks

    def redis_dump(self) -> bytes:
        """Every value in Redis, compressed job data included, as one blob to search."""
        parts: list[bytes] = []
        with contextlib.closing(self.connection()) as connection:
            for key in connection.scan_iter(count=1000):
                parts.append(key)
                parts.extend(
                    _readable(v) for v in _values_of(connection, key) if isinstance(v, bytes)
                )
        return b"\n".join(parts)

    def reset(self) -> None:
        """A clean slate for the next test: Redis flushed, Hub and model script emptied."""
        self.end_workers()
        if self.redis_server.process.poll() is not None:
            self.redis_server.start_again()
        if self.hub.process is None or self.hub.process.poll() is not None:
            self.hub.start()
        with contextlib.closing(self.connection()) as connection:
            connection.flushall()
        self.hub.reset()
        self.llm.reset()
        write_agents(self.agents_dir)


def _renewing_the_scheduler_lock(client: Mapping[str, str]) -> bool:
    """A client held by a write pause inside a transaction whose first command is an HSET:
    rq's scheduler heartbeat (``x``: in MULTI, ``b``: blocked), the only one an idle worker
    sends."""
    return {"x", "b"} <= set(client["flags"]) and client["cmd"] == "hset"


def _values_of(connection: Any, key: bytes) -> list[Any]:
    kind = connection.type(key)
    if kind == b"string":
        return [connection.get(key)]
    if kind == b"hash":
        return list(connection.hgetall(key).values())
    if kind == b"list":
        return list(connection.lrange(key, 0, -1))
    if kind == b"set":
        return list(connection.smembers(key))
    if kind == b"zset":
        return list(connection.zrange(key, 0, -1))
    if kind == b"stream":
        return [value for _, entry in connection.xrange(key) for value in entry.values()]
    return []


def _readable(value: bytes) -> bytes:
    # rq compresses job data; search what it holds, not its compressed bytes.
    try:
        return zlib.decompress(value)
    except zlib.error:
        return value


def kill_marked_processes(stack_id: str) -> list[int]:
    """SIGKILL every process carrying this stack's marker (orphaned job processes, schedulers)."""
    killed = []
    wanted = f"{STACK_MARKER}={stack_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def pid_alive(pid: int) -> bool:
    return process_running(pid)


def concurrent_workers() -> bool:
    """True when every worker runs its tasks in threads (AGENT_TEST_WORKER_CONCURRENCY)."""
    return int(os.environ.get(TEST_CONCURRENCY_VARIABLE) or "1") > 1


def crash_recovery_args() -> tuple[str, ...]:
    """Worker options for a test that kills a worker running its tasks in threads.

    The tasks die with it, and only rq's abandoned-job recovery re-runs them: once each
    execution's heartbeat expired (HEARTBEAT_GRACE_S after the next one was due, with
    ``crash_recovery_env``) and a worker's maintenance ran. Heartbeats every 5 s and
    maintenance every 2 s keep that inside a chaos task's deadline. A forked job process
    is handed back by its own failure handling instead.
    """
    if not concurrent_workers():
        return ()
    return ("--job-monitoring-interval", "5", "--maintenance-interval", "2")


def crash_recovery_env() -> dict[str, str]:
    """The environment that goes with ``crash_recovery_args``."""
    if not concurrent_workers():
        return {}
    return {"HEARTBEAT_GRACE_S": str(HEARTBEAT_GRACE_S)}


def worker_pid_of(runner_pid: int) -> int | None:
    """The worker running a task, from the pid holding its lease: the parent of a forked
    job process, or the process itself when it runs its tasks in threads."""
    return runner_pid if concurrent_workers() else parent_pid(runner_pid)


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


# -- agent definitions and MCP configuration ---------------------------------------------------


def agent_config(name: str, **sections: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name,
        "type": "native",
        "brain": {"provider": "openai", "model": MODEL, "max_tokens": 500},
        "capabilities": {"grants": ["hub:read", "hub:write"], "mcp_servers": ["hub"]},
        # The public format's write caps default to 60 s between writes and 3 replies per
        # thread: these tests post as one agent many times a minute, and re-run tasks.
        "behavior": {
            "max_iterations": 8,
            "max_concurrent": 50,
            "limits": {
                "max_daily_posts": 10_000,
                "max_daily_comments": 10_000,
                "max_responses_per_thread": 10_000,
                "min_interval_seconds": 0,
            },
        },
        # A crashed run's re-run keeps the first run's deadline: room for a loaded machine's
        # slow worker start, the heartbeat expiry and rq's maintenance before it.
        "limits": {"max_tokens": 200_000, "max_duration_s": 240},
    }
    for section, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **value}
        else:
            config[section] = value
    return config


def write_agents(agents_dir: Path) -> None:
    # Its side-effect posts (crash and intent tests) are an explicit opt-in: a notification's
    # narrow scope makes no post at all.
    write_agent(agents_dir, AGENT, agent_config(AGENT, scope={"post_in": ["m/general"]}))
    write_agent(
        agents_dir,
        READER,
        agent_config(READER, capabilities={"grants": ["hub:read"], "mcp_servers": ["hub", "web"]}),
    )
    write_agent(
        agents_dir,
        KIT_AGENT,
        agent_config(
            KIT_AGENT,
            capabilities={"grants": ["hub:read", "kit:use"], "mcp_servers": ["hub", "kit"]},
        ),
    )


def write_mcp_config(
    path: Path, *, hub_port: int, web_port: int, canaries: Canaries, junk_url: str
) -> None:
    """hub and web over HTTP; ``kit`` (the test toolkit) over stdio holding a credential in
    its env, as a GitHub server would; ``junk`` an HTTP 'server' that answers garbage."""
    config = {
        "servers": {
            "hub": {
                "url": f"http://127.0.0.1:{hub_port}/mcp",
                "first_party": True,
                "tools": {
                    "search_posts": "hub:read",
                    "get_thread": "hub:read",
                    "get_feed": "hub:read",
                    "create_post": "hub:write",
                    "create_comment": "hub:write",
                },
            },
            "web": {
                "url": f"http://127.0.0.1:{web_port}/mcp",
                "first_party": True,
                "tools": {"fetch": "web:read"},
            },
            "kit": {
                "command": sys.executable,
                "args": ["-m", "tests.support.mcp_test_servers.toolkit", "--stdio"],
                "cwd": str(REPO_ROOT),
                "env": {"GITHUB_TOKEN": canaries.github_token},
                "tools": {"echo": "kit:use", "huge": "kit:use", "fail": "kit:use"},
            },
            "junk": {"url": junk_url, "tools": {"*": "junk:use"}},
        }
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


@contextmanager
def garbage_http_server() -> Iterator[str]:
    """An 'MCP server' answering every request with bytes that are not JSON-RPC."""
    script = (
        "import http.server, sys\n"
        "class Junk(http.server.BaseHTTPRequestHandler):\n"
        "    def _junk(self):\n"
        "        body = b'\\x00\\xffthis is not json-rpc {{{' * 100\n"
        "        self.send_response(200)\n"
        "        self.send_header('content-type', 'application/json')\n"
        "        self.send_header('content-length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    do_GET = do_POST = do_DELETE = _junk\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), Junk).serve_forever()\n"
    )
    port = free_port()
    server = ManagedProcess("junk-mcp", [sys.executable, "-c", script, str(port)], port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.stop()


@contextmanager
def running_chaos_stack(workdir: Path) -> Iterator[ChaosStack]:
    canaries = Canaries.fresh()
    agents_dir = workdir / "definitions"
    write_agents(agents_dir)
    with ExitStack() as stack:
        # Append-only, so a restarted Redis still holds what it held (the restart scenarios).
        redis_server = stack.enter_context(running_redis(appendonly=True))
        hub = DevHub(
            port=free_port(), api_key=canaries.hub_api_key, state_file=workdir / "devhub.json"
        )
        stack.callback(hub.cleanup)
        hub.start()
        llm = stack.enter_context(running_scripted_llm(subprocess=True))
        mcp_hub_port, web_port = free_port(), free_port()
        server_env = {
            "MCP_AUTH_TOKEN": canaries.mcp_auth_token,
            "CAPABILITY_KEY": canaries.capability_key,
        }
        mcp_servers = [
            ManagedProcess(
                "mcp-hub",
                python_module("mcp_servers.hub", "--port", str(mcp_hub_port)),
                mcp_hub_port,
                {
                    **server_env,
                    "HUB_URL": hub.url,
                    "HUB_API_KEY": canaries.hub_api_key,
                    # A tool credential lives only in the tool server's environment.
                    "GITHUB_TOKEN": canaries.github_token,
                },
            ),
            ManagedProcess(
                "mcp-web",
                python_module("mcp_servers.web", "--port", str(web_port)),
                web_port,
                server_env,
            ),
        ]
        for server in mcp_servers:
            stack.callback(server.start(ready_timeout_s=SERVER_READY_TIMEOUT_S).stop)
        junk_url = stack.enter_context(garbage_http_server())
        mcp_config = workdir / "mcp.yaml"
        write_mcp_config(
            mcp_config,
            hub_port=mcp_hub_port,
            web_port=web_port,
            canaries=canaries,
            junk_url=junk_url,
        )
        chaos = ChaosStack(
            redis_server=redis_server,
            hub=hub,
            llm=llm,
            mcp_servers=mcp_servers,
            workdir=workdir,
            agents_dir=agents_dir,
            mcp_config=mcp_config,
            canaries=canaries,
        )
        stack.callback(chaos.end_workers)
        yield chaos


def counted_in_textfile(path: Path, metric: str) -> float:
    """A counter summed over every label set, as a burst worker wrote it to
    ``METRICS_TEXTFILE``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in path.read_text().splitlines()
        if line.startswith(f"{metric}{{")
    )


def scrape_metric(port: int, name: str) -> float | None:
    """One sample of a metric from a worker's /metrics (the first series of that name)."""
    text = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return None


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                lines.append(item)
    return lines


def ride_out_redis_restarts(chaos: ChaosStack, worker: WorkerProcess) -> None:
    """Restart Redis under ``worker`` (an ``rq worker`` or a pool) at each moment that can
    trip it: idle, while rq's scheduler renews its lock, and mid-task with another task
    queued. Every task completes once, and no process quits or raises."""
    chaos.redis_server.start_again()  # while idle
    first = chaos.notification("idle-restart", [{"text": "Served after an idle restart"}])
    assert chaos.wait_for_status(first) == "finished"

    # A restarted Redis has forgotten every Lua script: rq's scheduler, retrying its lock
    # renewal there, must load its script again, stay up and keep moving delayed tasks.
    chaos.restart_redis_while_the_scheduler_renews_its_lock()
    delayed = chaos.notification(
        "delayed-restart", [{"text": "Scheduled across a restart"}], delay_s=1
    )
    assert chaos.wait_for_outcome(delayed, timeout_s=30)["outcome"] == "completed"
    assert worker.events("redis_scripts_lost")  # the restart came where it trips rq

    # The answer comes 5 s after the model is asked: the outage must begin before it even
    # when the loaded suite is slow to stop Redis (2 s was not enough), and lasts longer.
    running = chaos.notification(
        "busy-restart", [{"text": "Served across a restart", "delay_s": 5}]
    )
    wait_until(lambda: chaos.llm.requests(running), 60, "the model to be asked")
    waiting = chaos.notification("queued-restart", [{"text": "Queued across a restart"}])
    # Mid-task, with another task waiting in the queue; down long enough that the job
    # process (its model answer arrives meanwhile) and the worker both run into it.
    chaos.redis_server.stop()
    down_at = time.time()
    time.sleep(REDIS_RESTART_OUTAGE_S)
    up_at = time.time()
    chaos.redis_server.start_again()

    for task_id in (first, delayed, running, waiting):
        assert chaos.wait_for_outcome(task_id)["outcome"] == "completed", task_id
        assert chaos.status(task_id) == "finished"
        post_id = chaos.job(task_id).args[0]["post_id"]
        replies = chaos.replies_to(post_id)
        # On failure, what the worker logged of the task tells where its reply went.
        said = [e for e in worker.events() if e.get("task") == task_id]
        assert len(replies) == 1, (task_id, replies, chaos.outbox_size(), said)
        assert len(chaos.consumption_of(task_id)) == 1, task_id
        assert chaos.error_posts_about(task_id) == []
    # The job process really met the outage: the model answered while Redis was down.
    (answered,) = [e for e in worker.events("llm_call") if e["task"] == running]
    assert down_at < datetime.fromisoformat(answered["ts"]).timestamp() < up_at
    assert worker.alive()
    rq_messages = [str(e.get("message")) for e in worker.events("rq_log")]
    assert [m for m in rq_messages if "quitting" in m or "raised an exception" in m] == []
    assert worker.events("scheduler_stopped") == []


def remembered(
    chaos: ChaosStack,
    agent: str,
    text: str,
    *,
    about: str,
    audience: str = PUBLIC,
    provenance: Provenance = Provenance.UNTRUSTED,
) -> None:
    """A memory of ``agent`` holding ``text``: what an earlier task kept of someone's words."""
    record = MemoryRecord(
        id=memory_id(agent, "seeded", text),
        kind=MemoryKind.CONVERSATION,
        text=text,
        task_id="t-earlier",
        created_at=time.time() - 3600,
        about=(about,),
        audience=audience,
        provenance=provenance,
    )
    RedisMemoryStore(chaos.connection()).add(agent, [record], max_bytes=10_000_000)
