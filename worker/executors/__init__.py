"""Executors by agent ``type``: ``native`` (our loop) and the coding-agent CLIs.

Every executor takes an ``ExecutionRequest`` and returns the same ``RunResult``, so
the job builds the same AgentReport whatever ran. The CLI executors run the whole
task in the CLI's own loop, in a scratch workspace, with only the agent's granted
tools (through ``mcp_servers.gateway``) and within the task's deadline.
"""

from worker.executors._aider import AiderExecutor
from worker.executors._base import ExecutionRequest, Executor, NativeExecutor
from worker.executors._claude import ClaudeCodeExecutor
from worker.executors._cli import CliExecutor
from worker.executors._goose import GooseExecutor
from worker.executors._opencode import OpenCodeExecutor

EXECUTORS: dict[str, type[Executor]] = {
    "native": NativeExecutor,
    "claude-code": ClaudeCodeExecutor,
    "goose": GooseExecutor,
    "aider": AiderExecutor,
    "opencode": OpenCodeExecutor,
}


def executor_for(agent_type: str) -> Executor:
    """The executor for an agent's ``type``; unknown types are a configuration error."""
    from worker.exceptions import AgentConfigError

    try:
        return EXECUTORS[agent_type]()
    except KeyError:
        known = ", ".join(sorted(EXECUTORS))
        raise AgentConfigError(
            f"no executor for agent type {agent_type!r} (known: {known})"
        ) from None


__all__ = [
    "EXECUTORS",
    "AiderExecutor",
    "ClaudeCodeExecutor",
    "CliExecutor",
    "ExecutionRequest",
    "Executor",
    "GooseExecutor",
    "NativeExecutor",
    "OpenCodeExecutor",
    "executor_for",
]
