"""Executors by agent ``type``: ``native`` (our loop) and the coding-agent CLIs.

Every executor takes an ``ExecutionRequest`` and returns the same ``RunResult``, so
the job builds the same AgentReport whatever ran. The CLI executors run the whole
task in the CLI's own loop, in a bubblewrap sandbox around a scratch workspace, with
only the agent's granted tools (through ``mcp_servers.gateway``, which the worker runs
outside the sandbox) and within the task's deadline.

The gateway side of that contract (``GatewaySpec``, the call log, the secrets) is here
too. Every name loads on first use, so that ``mcp_servers.gateway``, which
runs once per CLI task, does not load the executors, rq and prometheus.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.executors._base import ExecutionRequest as ExecutionRequest
    from worker.executors._base import Executor as Executor
    from worker.executors._call_log import CallLogWriter as CallLogWriter
    from worker.executors._cli import CliExecutor as CliExecutor
    from worker.executors._gateway_link import GatewaySpec as GatewaySpec
    from worker.executors._gateway_secrets import CAPABILITY as CAPABILITY
    from worker.executors._gateway_secrets import MCP_AUTH_TOKEN as MCP_AUTH_TOKEN
    from worker.executors._gateway_secrets import GatewayWriteCaps as GatewayWriteCaps
    from worker.executors._gateway_secrets import read_secrets as read_secrets
    from worker.executors._provider import provider_access as provider_access
    from worker.executors._sandbox import sandbox_problem as sandbox_problem
    from worker.executors._sandbox import sandbox_warning as sandbox_warning

    EXECUTORS: dict[str, type[Executor]]


# Agent ``type`` -> the executor class, imported with the first lookup.
_EXECUTOR_CLASSES = {
    "native": ("worker.executors._base", "NativeExecutor"),
    "claude-code": ("worker.executors._claude", "ClaudeCodeExecutor"),
    "goose": ("worker.executors._goose", "GooseExecutor"),
    "aider": ("worker.executors._aider", "AiderExecutor"),
    "opencode": ("worker.executors._opencode", "OpenCodeExecutor"),
}


def _executors() -> dict[str, type[Executor]]:
    executors: dict[str, type[Executor]] = {
        agent_type: getattr(importlib.import_module(module), name)
        for agent_type, (module, name) in _EXECUTOR_CLASSES.items()
    }
    return executors


def executor_for(agent_type: str) -> Executor:
    """The executor for an agent's ``type``; unknown types are a configuration error."""
    from worker.exceptions import AgentConfigError

    try:
        return _executors()[agent_type]()
    except KeyError:
        known = ", ".join(sorted(_EXECUTOR_CLASSES))
        raise AgentConfigError(
            f"no executor for agent type {agent_type!r} (known: {known})"
        ) from None


_lazy_name = lazy_getattr(__name__)


def __getattr__(name: str) -> Any:
    if name == "EXECUTORS":
        return _executors()
    return _lazy_name(name)
