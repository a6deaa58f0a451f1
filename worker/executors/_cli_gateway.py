"""The gateway a CLI task gets: its spec, its secrets, the worker's process, the CLI's bridge.

The worker's side of ``worker.executors._gateway_link``: from an ``ExecutionRequest``
it decides whether the CLI gets tools at all (an MCP configuration and a grant), and
starts ``mcp_servers.gateway --socket`` itself, outside the CLI's sandbox, with the
secrets (``MCP_AUTH_TOKEN``, tool credentials, the task's capability, the write caps'
Redis) written on the gateway's stdin from the worker's memory: no file holds them.
The CLI's MCP configuration starts only the bridge (``sandbox_helper.py bridge``), which
carries MCP between the CLI's stdio and the gateway's Unix socket: the CLI never holds
a secret, a token, a capability or a path to one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from worker._spawn import SpawnHook
from worker.executors._base import ExecutionRequest
from worker.executors._gateway_link import GatewaySpec
from worker.executors._gateway_secrets import (
    GatewayWriteCaps,
    gateway_capability,
    gateway_secrets,
)
from worker.hub_writes import WriteCaps
from worker.tracing import gateway_trace_environment

# The name the CLIs' MCP configurations give the gateway: their tools are named after it.
GATEWAY_SERVER = "gateway"
GATEWAY_SOCKET = "gateway.sock"
# How long the bridge waits for the gateway to listen (it imports the worker first).
GATEWAY_START_TIMEOUT_S = 60.0
GATEWAY_STOP_GRACE_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayLaunch:
    """How the CLI reaches the gateway: the bridge command its MCP configuration runs.
    ``env`` is empty: the bridge needs nothing, and the CLI gets nothing to read there."""

    command: list[str]
    env: dict[str, str]

    @property
    def executable(self) -> str:
        return self.command[0]

    @property
    def args(self) -> list[str]:
        return self.command[1:]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskGateway:
    """The task's gateway: its spec (no secrets) and the secrets it gets on stdin."""

    spec: GatewaySpec
    secrets: dict[str, str]
    # What the executor masks in what the run reports.
    masked: tuple[str, ...]


def task_gateway(
    request: ExecutionRequest, gateway_dir: Path, deadline_epoch_s: float
) -> TaskGateway | None:
    """The task's gateway, its call log in ``gateway_dir`` (never seen by the CLI); None
    when the agent has no tools in this task (no ``MCP_CONFIG``, or no grant)."""
    settings, grants = request.worker_settings, request.grants
    if settings.mcp_config is None or not grants.allowed:
        return None
    config = request.agent.config
    mcp_config = settings.mcp_config.resolve()
    allowed_tools = request.task.constraints.allowed_tools
    spec = GatewaySpec(
        agent_id=config.name,
        task_id=request.task.task_id,
        mcp_config=mcp_config,
        call_log=gateway_dir / "gateway-calls.jsonl",
        grants=tuple(sorted(grants.allowed)),
        denied_grants=tuple(sorted(grants.denied)),
        allowed_tools=tuple(allowed_tools) if allowed_tools is not None else None,
        servers=tuple(config.capabilities.server_names) or None,
        strict_grants=grants.strict,
        deadline_epoch_s=deadline_epoch_s,
        tool_timeout_s=request.settings.tool_timeout_cap_s,
        max_output_chars=request.settings.tool_output_max_chars,
        workdir=Path.cwd(),
        can_execute_tool=settings.can_execute_tool,
        untrusted_nonce=request.untrusted_nonce,
        require_capability=settings.capability_key is not None,
        scope=request.scope,
        web_server=settings.web_tool_server,
    )
    credentials = gateway_secrets(mcp_config, settings)
    # The task's signed capability, never the key; the write caps with the fleet's Redis.
    capability = gateway_capability(
        settings.capability_key,
        agent_id=config.name,
        task_id=request.task.task_id,
        grants=grants,
        deadline_epoch_s=deadline_epoch_s,
        scope=request.scope,
    )
    caps = WriteCaps.of(request.agent, max_writes_per_post=settings.max_writes_per_post)
    write_caps = GatewayWriteCaps.of(settings, caps)
    secrets = credentials | capability | write_caps.secrets()
    masked = (*credentials.values(), *capability.values(), *write_caps.secret_values())
    return TaskGateway(spec=spec, secrets=secrets, masked=tuple(masked))


@dataclass(eq=False, slots=True)
class GatewayProcess:
    """The task's running gateway, as the executor watches it while the CLI runs."""

    process: anyio.abc.Process

    def exited(self) -> bool:
        """True once the gateway is gone: it never exits on its own while the CLI runs."""
        return self.process.returncode is not None


@asynccontextmanager
async def running_gateway(
    gateway: TaskGateway,
    socket_path: Path,
    *,
    home: Path,
    on_spawn: SpawnHook,
) -> AsyncIterator[GatewayProcess]:
    """Start the task's gateway on ``socket_path``; stop its process group (and with it the
    stdio servers it did not move out) on the way out. The CLI starts meanwhile: its
    bridge waits for the socket, so the two start-ups overlap.

    ``home`` is the gateway's HOME, and its servers': a directory the sandbox never
    mounts, so what they log, cache or store there (npm's debug logs with a server's
    argv, token stores) stays out of the CLI's reach."""
    env = (
        {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONPATH": gateway_python_path(),
        }
        | tool_server_home(home)
        | gateway.spec.environment()
    )
    env |= gateway_trace_environment(os.environ)  # its spans join this CLI run's trace
    process = await anyio.open_process(
        gateway_command(socket_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=None,  # its JSON log lines join the worker's, redacted by the gateway
        env=env,
        start_new_session=True,
    )
    try:
        on_spawn(process.pid)
        assert process.stdin is not None
        await process.stdin.send(json.dumps(gateway.secrets).encode("utf-8"))
        await process.stdin.aclose()
        yield GatewayProcess(process)
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(process)


async def _stop(process: anyio.abc.Process) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with anyio.move_on_after(GATEWAY_STOP_GRACE_S):
        await process.wait()
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with anyio.move_on_after(GATEWAY_STOP_GRACE_S):
        await process.aclose()


def tool_server_home(home: Path) -> dict[str, str]:
    """HOME and the places tools keep caches, logs and state, all under ``home``: npm and
    uv honour their own variables before XDG's, the rest XDG or HOME."""
    return {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "npm_config_cache": str(home / ".npm"),
        "TMPDIR": str(home),
    }


def bridge_launch(python: str, private: Path) -> GatewayLaunch:
    """What the CLI's MCP configuration runs: the bridge to the gateway's socket."""
    helper = private / "sandbox_helper.py"
    wait_s = f"{GATEWAY_START_TIMEOUT_S:g}"
    return GatewayLaunch(
        command=[python, str(helper), "bridge", str(private / GATEWAY_SOCKET), wait_s], env={}
    )


def gateway_command(socket_path: Path) -> list[str]:
    """How the worker starts the gateway: this interpreter, the module, on a Unix socket."""
    return [sys.executable, "-m", "mcp_servers.gateway", "--socket", str(socket_path)]


def gateway_python_path() -> str:
    """The directory holding ``mcp_servers`` and ``worker``, for the gateway's PYTHONPATH:
    a worker run from a source checkout (not installed) could not import it otherwise.
    Both packages ship side by side in one distribution: the parent of ``worker``."""
    return str(Path(__file__).resolve().parents[2])
