"""Executors by agent ``type``: ``native`` (our loop) and the coding-agent CLIs."""

from worker.executors._base import ExecutionRequest, Executor, NativeExecutor

EXECUTORS: dict[str, type[Executor]] = {"native": NativeExecutor}


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


__all__ = ["EXECUTORS", "ExecutionRequest", "Executor", "NativeExecutor", "executor_for"]
