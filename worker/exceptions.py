"""Errors raised by the worker, grouped by what the caller should do about them.

    WorkerError                      base; every error has a stable ``code`` and a ``severity``
    ├── ConfigurationError           the operator's configuration is wrong: fix it and restart
    ├── TaskFailed                   this task cannot finish; the job fails in rq
    │   ├── InvalidTask              the task itself is malformed or names an unknown agent
    │   ├── AgentConfigError         the agent definition is wrong (file and field named)
    │   ├── ModelError               the model cannot be used for this task
    │   │   ├── ModelAuthError       401/403 from the provider
    │   │   ├── ModelRequestError    the provider refused the request as invalid
    │   │   │   └── ContextTooLong   ... because the prompt is longer than the window
    │   │   └── ModelUnavailable     429/5xx/connection errors outlived the retries (requeue)
    │   ├── StructuredOutputError    the model's answer did not match the requested type
    │   ├── AutonomyViolation        a call without its grant under strict grants
    │   └── ExecutorError            a CLI executor failed (exit status, unparseable output)
    ├── LimitReached                 a limit of the run was reached; the loop winds down
    │                                (in ``worker.loop``, which alone raises and catches it)
    ├── WriteCapReached              an agent's Hub write cap refused the task's own reply
    └── ToolFailed                   one tool call failed; the model reads it and goes on
        ├── ToolNotFound
        ├── ToolArgumentsInvalid
        └── ToolServerDown

Messages name the task, agent, tool, server or file concerned. They never carry
secrets: anything that reaches logs or posts goes through ``worker.redaction``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class WorkerError(Exception):
    code: str = "error"
    severity: Severity = Severity.ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"class": type(self).__name__, "code": self.code, "message": self.message}


class ConfigurationError(WorkerError):
    code = "configuration_error"
    severity = Severity.CRITICAL


class TaskFailed(WorkerError):
    code = "task_failed"


class InvalidTask(TaskFailed):
    code = "invalid_task"
    severity = Severity.WARNING


class AgentConfigError(TaskFailed):
    code = "agent_config_error"


class ModelError(TaskFailed):
    code = "model_error"

    def __init__(self, message: str, *, provider: str = "", model: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        self.model = model


class ModelAuthError(ModelError):
    code = "model_auth_error"
    severity = Severity.CRITICAL


class ModelRequestError(ModelError):
    code = "model_request_error"


class ContextTooLong(ModelRequestError):
    """The provider refused a prompt longer than the model's context window.

    ``prompt_tokens``: the prompt's size as the provider counted it, when it said so.
    """

    def __init__(
        self, message: str, *, provider: str = "", model: str = "", prompt_tokens: int | None
    ) -> None:
        super().__init__(message, provider=provider, model=model)
        self.prompt_tokens = prompt_tokens


class ModelUnavailable(ModelError):
    """The provider stayed unavailable through every retry and fallback.

    ``retry_after_s`` is the provider's last hint, if any; the worker uses it
    to pick the delay before the task is re-enqueued.
    """

    code = "model_unavailable"
    severity = Severity.WARNING

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, provider=provider, model=model)
        self.retry_after_s = retry_after_s


class StructuredOutputError(TaskFailed):
    code = "structured_output_error"

    def __init__(self, message: str, *, model: str = "", raw: str = "") -> None:
        super().__init__(message)
        self.model = model
        self.raw = raw


class AutonomyViolation(TaskFailed):
    code = "autonomy_violation"
    severity = Severity.CRITICAL


class ExecutorError(TaskFailed):
    code = "executor_error"


class WriteCapReached(WorkerError):
    """The task's answer was not posted: a write cap of the agent refused it.

    ``limit`` names the cap (a write-cap refusal reason, not a loop ``Limit``).
    """

    code = "write_cap_reached"
    severity = Severity.WARNING

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class ToolFailed(WorkerError):
    code = "tool_failed"
    severity = Severity.WARNING


class ToolNotFound(ToolFailed):
    code = "tool_not_found"


class ToolArgumentsInvalid(ToolFailed):
    code = "tool_arguments_invalid"


class ToolServerDown(ToolFailed):
    code = "tool_server_down"


def error_payload(exc: BaseException) -> dict[str, Any]:
    """The ``error`` object of an AgentReport for any exception."""
    if isinstance(exc, WorkerError):
        return {"class": type(exc).__name__, "message": exc.message}
    return {"class": type(exc).__name__, "message": str(exc)}
