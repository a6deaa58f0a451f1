"""A local stack of real processes: redis-server, devhub, our MCP servers, a scripted LLM.

One way to start them for ``make demo``, the integration tests and the
benchmarks. Every process gets a free port, runs in its own process group
and is stopped (group and all) when the stack closes.
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REDIS_MISSING = (
    "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server; "
    "macOS: brew install redis)"
)
# The scripted endpoint takes any key; a random-looking one, since every secret value is
# masked wherever it appears (a plain word would be blanked out of the agents' answers).
SCRIPTED_ENDPOINT_KEY = "sk-scripted-7d41c9e0b2a85f36"


# ``DEVSTACK_PORTS=LOW-HIGH``: the ports free_port hands out, in turn from a random start.
PORTS_VARIABLE = "DEVSTACK_PORTS"
_next_port: Iterator[int] | None = None


def free_port() -> int:
    """A port nothing listens on now: from ``DEVSTACK_PORTS`` when set, else the kernel's pick.

    The kernel picks from its ephemeral range, which outgoing connections draw from too, so
    between this check and the server's bind the port may be taken: rarely, but often enough
    among parallel test processes that each start dozens of servers. The test suite gives
    each of its processes a block of its own, below that range.
    """
    global _next_port
    span = os.environ.get(PORTS_VARIABLE)
    if span:
        if _next_port is None:
            low, high = (int(bound) for bound in span.split("-"))
            start = random.randrange(low, high + 1)
            _next_port = itertools.chain(
                range(start, high + 1), itertools.cycle(range(low, high + 1))
            )
        for _ in range(200):
            port = next(_next_port)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@dataclass
class ManagedProcess:
    """A child process in its own process group, with its output kept in a log file."""

    name: str
    argv: Sequence[str]
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self, *, ready_timeout_s: float = 30.0) -> ManagedProcess:
        descriptor, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
        self.log_path = Path(path)
        with os.fdopen(descriptor, "wb") as log:
            self.process = subprocess.Popen(
                list(self.argv),
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout_s
        while not port_open(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not listen on {self.port}:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass

    def remove_log(self) -> None:
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class DevStack:
    """URLs and secrets of a running stack; ``worker_env()`` is what a worker needs."""

    redis_url: str
    hub_url: str
    hub_api_key: str
    mcp_auth_token: str
    # Signs each task's capability; the stack's MCP servers verify it (the secure path).
    capability_key: str
    mcp_config: Path
    llm_base_url: str | None
    processes: list[ManagedProcess] = field(default_factory=list)

    def worker_env(self, **extra: str) -> dict[str, str]:
        env = {
            "REDIS_URL": self.redis_url,
            "HUB_URL": self.hub_url,
            "HUB_API_KEY": self.hub_api_key,
            "MCP_AUTH_TOKEN": self.mcp_auth_token,
            "CAPABILITY_KEY": self.capability_key,
            "MCP_CONFIG": str(self.mcp_config),
            "RQ_WORKER_CLASS": "worker.AgentWorker",
            "RQ_CONFIG": "worker.rq_config",
        }
        if self.llm_base_url is not None:
            env["OPENAI_BASE_URL"] = self.llm_base_url + "/v1"
            env["OPENAI_API_KEY"] = SCRIPTED_ENDPOINT_KEY
            env["ANTHROPIC_BASE_URL"] = self.llm_base_url
            env["ANTHROPIC_API_KEY"] = SCRIPTED_ENDPOINT_KEY
        env.update(extra)
        return env


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def redis_server_command(port: int, workdir: str, *, appendonly: bool = False) -> list[str]:
    """A private redis-server: loopback only, nothing saved unless ``appendonly``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(REDIS_MISSING)
    return [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "yes" if appendonly else "no", "--dir", workdir,
    ]  # fmt: skip


def start_redis(stack: ExitStack) -> str:
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="devstack-redis-")
    stack.callback(shutil.rmtree, workdir, True)
    redis = ManagedProcess("redis-server", redis_server_command(port, workdir), port)
    stack.callback(redis.remove_log)  # after the stop below (an ExitStack unwinds LIFO)
    stack.callback(redis.start().stop)
    return f"redis://127.0.0.1:{port}/0"


def write_mcp_config(directory: Path, *, hub_port: int, web_port: int) -> Path:
    path = directory / "mcp.yaml"
    path.write_text(
        "servers:\n"
        f"  hub:\n    url: http://127.0.0.1:{hub_port}/mcp\n    first_party: true\n"
        "    tools: {search_posts: hub:read, get_thread: hub:read, get_feed: hub:read,\n"
        "            create_post: hub:write, create_comment: hub:write}\n"
        f"  web:\n    url: http://127.0.0.1:{web_port}/mcp\n    first_party: true\n"
        "    tools: {fetch: web:read}\n"
    )
    return path


def _launch(
    stack: ExitStack,
    processes: list[ManagedProcess],
    name: str,
    module: str,
    env: dict[str, str],
    *args: str,
) -> int:
    """Run ``python -m module --port PORT *args`` on a free port until ``stack`` closes, and
    add it to ``processes``; returns the port."""
    port = free_port()
    process = ManagedProcess(name, python_module(module, "--port", str(port), *args), port, env)
    stack.callback(process.remove_log)
    stack.callback(process.start().stop)
    processes.append(process)
    return port


@contextmanager
def running_stack(
    *, redis_url: str | None = None, scripted_llm: bool = True, llm_latency_s: float = 0.0
) -> Iterator[DevStack]:
    """Start devhub, mcp-hub, mcp-web and (optionally) the scripted LLM endpoint.

    ``redis_url``: use that Redis; None starts a throwaway redis-server.
    """
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="devstack-"))
        stack.callback(shutil.rmtree, workdir, True)
        redis_url = redis_url or start_redis(stack)
        hub_key = "devhub-" + secrets.token_hex(16)
        token = "mcp-" + secrets.token_hex(16)
        capability_key = secrets.token_hex(32)
        processes: list[ManagedProcess] = []
        hub_env = {"HUB_API_KEY": hub_key}
        hub_port = _launch(stack, processes, "devhub", "hub_client.devhub", hub_env)
        hub_url = f"http://127.0.0.1:{hub_port}"
        server_env = {"MCP_AUTH_TOKEN": token, "CAPABILITY_KEY": capability_key}
        mcp_hub_env = {**server_env, "HUB_URL": hub_url, "HUB_API_KEY": hub_key}
        mcp_hub_port = _launch(stack, processes, "mcp-hub", "mcp_servers.hub", mcp_hub_env)
        web_port = _launch(stack, processes, "mcp-web", "mcp_servers.web", server_env)
        llm_url = None
        if scripted_llm:
            latency = ("--latency-s", str(llm_latency_s))
            module = "worker.dev.scripted_endpoint"
            llm_port = _launch(stack, processes, "scripted-llm", module, {}, *latency)
            llm_url = f"http://127.0.0.1:{llm_port}"
        yield DevStack(
            redis_url=redis_url,
            hub_url=hub_url,
            hub_api_key=hub_key,
            mcp_auth_token=token,
            capability_key=capability_key,
            mcp_config=write_mcp_config(workdir, hub_port=mcp_hub_port, web_port=web_port),
            llm_base_url=llm_url,
            processes=processes,
        )
