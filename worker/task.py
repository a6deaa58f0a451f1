"""The wire formats the Hub and the worker exchange: Task in, AgentReport out."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from worker.exceptions import InvalidTask

TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
TaskId = Annotated[str, StringConstraints(pattern=TASK_ID_PATTERN)]
# Generous caps: a field over them is hostile or broken, never a real task.
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class TaskType(StrEnum):
    NOTIFICATION = "notification"
    EXPLORATION = "exploration"


class Outcome(StrEnum):
    COMPLETED = "completed"
    MAX_ITERATIONS = "max_iterations"
    MAX_TOKENS = "max_tokens"
    DEADLINE = "deadline"
    BUDGET = "budget"
    TOOL_LOOP = "tool_loop"
    CANCELLED = "cancelled"
    BUDGET_UNHEALTHY = "budget_unhealthy"
    REQUEUED = "requeued"
    MODEL_ERROR = "model_error"
    AUTONOMY_VIOLATION = "autonomy_violation"
    INVALID_TASK = "invalid_task"
    ERROR = "error"

    @property
    def fails_job(self) -> bool:
        """Outcomes that make the rq job fail, so operators find them in the failed registry."""
        return self in _FAILING

    @property
    def posts_error(self) -> bool:
        """Outcomes reported to m/agent-errors."""
        return self in _FAILING or self is Outcome.TOOL_LOOP

    @property
    def answers(self) -> bool:
        """Outcomes whose final text is an answer worth posting (limits still produce one)."""
        return self in _ANSWERING


_FAILING = frozenset(
    {Outcome.MODEL_ERROR, Outcome.AUTONOMY_VIOLATION, Outcome.INVALID_TASK, Outcome.ERROR}
)
_ANSWERING = frozenset(
    {
        Outcome.COMPLETED,
        Outcome.MAX_ITERATIONS,
        Outcome.MAX_TOKENS,
        Outcome.DEADLINE,
        Outcome.BUDGET,
    }
)


class Constraints(BaseModel):
    """Per-task limits; each can only tighten the agent's own."""

    model_config = ConfigDict(extra="forbid")

    max_iterations: int | None = Field(default=None, ge=1, le=50)
    max_tokens: int | None = Field(default=None, ge=1)
    max_duration_s: float | None = Field(default=None, gt=0, le=86_400)
    max_cost_usd: float | None = Field(default=None, ge=0)
    allowed_tools: list[ShortText] | None = Field(default=None, max_length=500)


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: TaskId
    type: TaskType
    agent_id: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{3,50}$")]
    post_id: ShortText | None = None
    notification_id: ShortText | None = None
    priority: Literal["high", "normal", "low"] = "normal"
    constraints: Constraints = Field(default_factory=Constraints)

    @model_validator(mode="after")
    def _notification_needs_post(self) -> Task:
        if self.type is TaskType.NOTIFICATION and not self.post_id:
            raise ValueError("post_id is required for notification tasks")
        return self


def parse_task(raw: Any) -> Task:
    """Validate a task from the wire; raise InvalidTask naming every wrong field."""
    try:
        return Task.model_validate(raw)
    except ValidationError as exc:
        raise InvalidTask(f"invalid task: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: ``field.path: message``, input values left out."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"]) or "task"
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


class ErrorInfo(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    class_: str = Field(alias="class", serialization_alias="class")
    message: str


class AgentReport(BaseModel):
    """What every task that ran yields; stored in ``job.meta["report"]``."""

    model_config = ConfigDict(populate_by_name=True)

    task_id: str
    agent_id: str
    type: str
    outcome: Outcome
    output: str = ""
    iterations: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    tokens_input: int = 0
    tokens_output: int = 0
    cost_usd: float | None = 0.0
    duration_s: float = 0.0
    posted: list[str] = Field(default_factory=list)
    error: ErrorInfo | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
