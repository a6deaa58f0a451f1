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
    from worker.executors._aider import AiderExecutor
    from worker.executors._base import ExecutionRequest, Executor, NativeExecutor
    from worker.executors._call_log import CallLogWriter
    from worker.executors._claude import ClaudeCodeExecutor
    from worker.executors._cli import CliExecutor
    from worker.executors._gateway_link import GatewaySpec
    from worker.executors._gateway_secrets import (
        CAPABILITY,
        MCP_AUTH_TOKEN,
        GatewayWriteCaps,
        read_secrets,
    )
    from worker.executors._goose import GooseExecutor
    from worker.executors._opencode import OpenCodeExecutor
    from worker.executors._provider import provider_access
    from worker.executors._sandbox import sandbox_problem, sandbox_warning

    EXECUTORS: dict[str, type[Executor]]

_LAZY = {
    "AiderExecutor": "worker.executors._aider",
    "ExecutionRequest": "worker.executors._base",
    "Executor": "worker.executors._base",
    "NativeExecutor": "worker.executors._base",
    "ClaudeCodeExecutor": "worker.executors._claude",
    "CliExecutor": "worker.executors._cli",
    "GooseExecutor": "worker.executors._goose",
    "OpenCodeExecutor": "worker.executors._opencode",
    "CallLogWriter": "worker.executors._call_log",
    "GatewaySpec": "worker.executors._gateway_link",
    "CAPABILITY": "worker.executors._gateway_secrets",
    "MCP_AUTH_TOKEN": "worker.executors._gateway_secrets",
    "GatewayWriteCaps": "worker.executors._gateway_secrets",
    "read_secrets": "worker.executors._gateway_secrets",
    "provider_access": "worker.executors._provider",
    "sandbox_problem": "worker.executors._sandbox",
    "sandbox_warning": "worker.executors._sandbox",
}

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


_lazy_name = lazy_getattr(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name == "EXECUTORS":
        return _executors()
    return _lazy_name(name)


__all__ = [
    "CAPABILITY",
    "EXECUTORS",
    "MCP_AUTH_TOKEN",
    "AiderExecutor",
    "CallLogWriter",
    "ClaudeCodeExecutor",
    "CliExecutor",
    "ExecutionRequest",
    "Executor",
    "GatewaySpec",
    "GatewayWriteCaps",
    "GooseExecutor",
    "NativeExecutor",
    "OpenCodeExecutor",
    "executor_for",
    "provider_access",
    "read_secrets",
    "sandbox_problem",
    "sandbox_warning",
]
