"""The gateway a CLI task gets: its spec, its secrets file, and how the CLI starts it.

The worker's side of ``worker.executors._gateway_link``: from an ``ExecutionRequest``
it decides whether the CLI gets tools at all (an MCP configuration and a grant), writes
the secrets file into the task's private directory, and gives the CLI the command and
environment block that start ``mcp_servers.gateway`` over stdio.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from worker.executors._base import ExecutionRequest
from worker.executors._gateway_link import GatewaySpec
from worker.executors._gateway_secrets import (
    GatewayWriteCaps,
    gateway_capability,
    gateway_secrets,
    write_secrets_file,
)
from worker.hub_writes import WriteCaps
from worker.tracing import gateway_trace_environment

# The name the CLIs' MCP configurations give the gateway: their tools are named after it.
GATEWAY_SERVER = "gateway"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayLaunch:
    """How the CLI starts ``mcp_servers.gateway``: its command and its environment block."""

    command: list[str]
    env: dict[str, str]

    @property
    def executable(self) -> str:
        return self.command[0]

    @property
    def args(self) -> list[str]:
        return self.command[1:]


def task_gateway(
    request: ExecutionRequest, private: Path, deadline_epoch_s: float
) -> GatewaySpec | None:
    """The task's gateway, its secrets file written into ``private``; None when the agent
    has no tools in this task (no ``MCP_CONFIG``, or no grant)."""
    settings, grants = request.worker_settings, request.grants
    if settings.mcp_config is None or not grants.allowed:
        return None
    config = request.agent.config
    mcp_config = settings.mcp_config.resolve()
    secrets_file = _write_secrets(
        request, mcp_config, private / "gateway-secrets.json", deadline_epoch_s
    )
    allowed_tools = request.task.constraints.allowed_tools
    return GatewaySpec(
        agent_id=config.name,
        task_id=request.task.task_id,
        mcp_config=mcp_config,
        call_log=private / "gateway-calls.jsonl",
        grants=tuple(sorted(grants.allowed)),
        denied_grants=tuple(sorted(grants.denied)),
        allowed_tools=tuple(allowed_tools) if allowed_tools is not None else None,
        servers=tuple(config.capabilities.mcp_servers) or None,
        strict_grants=request.settings.strict_grants,
        deadline_epoch_s=deadline_epoch_s,
        tool_timeout_s=request.settings.tool_timeout_cap_s,
        max_output_chars=request.settings.tool_output_max_chars,
        secrets_file=secrets_file,
        workdir=Path.cwd(),
        can_execute_tool=settings.can_execute_tool,
        untrusted_nonce=request.untrusted_nonce,
        require_capability=settings.capability_key is not None,
    )


def _write_secrets(
    request: ExecutionRequest, mcp_config: Path, path: Path, deadline_epoch_s: float
) -> Path | None:
    """Write what only the gateway may read to ``path``; None when there is nothing."""
    settings = request.worker_settings
    # The task's signed capability rides in the private secrets file, never the key.
    secrets = gateway_secrets(mcp_config, settings) | gateway_capability(
        settings.capability_key,
        agent_id=request.agent.config.name,
        task_id=request.task.task_id,
        grants=request.grants,
        deadline_epoch_s=deadline_epoch_s,
    )
    # The agent's write caps and the fleet's Redis (a credential): the secrets file only.
    caps = WriteCaps.of(request.agent, max_writes_per_post=settings.max_writes_per_post)
    secrets |= GatewayWriteCaps.of(settings, caps).secrets()
    if not secrets:
        return None
    write_secrets_file(path, secrets)
    return path


def gateway_launch(spec: GatewaySpec, workspace: Path) -> GatewayLaunch:
    """The command and environment block a CLI's MCP configuration starts the gateway with."""
    env = spec.environment() | {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(workspace),
        "PYTHONPATH": gateway_python_path(),
    }
    env |= gateway_trace_environment(os.environ)  # its spans join this CLI run's trace
    return GatewayLaunch(command=gateway_command(), env=env)


def gateway_command() -> list[str]:
    """How a CLI starts the gateway: this interpreter, the module, over stdio."""
    return [sys.executable, "-m", "mcp_servers.gateway", "--stdio"]


def gateway_python_path() -> str:
    """The directory holding ``mcp_servers`` and ``worker``, for the gateway's PYTHONPATH.

    The CLI starts the gateway in the task's scratch directory: without it, a worker
    run from a source checkout (not installed) could not import the gateway there.
    """
    import mcp_servers

    return str(Path(mcp_servers.__file__).resolve().parent.parent)


def secrets_to_mask(spec: GatewaySpec | None, request: ExecutionRequest) -> list[str]:
    """The gateway's credentials the worker knows, for masking in what a run reports."""
    if spec is None or spec.secrets_file is None:
        return []
    return list(gateway_secrets(spec.mcp_config, request.worker_settings).values())
