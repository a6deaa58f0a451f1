"""The wire formats the Hub and the worker exchange: Task in, AgentReport out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Flag, StrEnum, auto
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from worker.exceptions import AutonomyViolation, InvalidTask, ModelError

TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
# The longest raw task field read before the task parsed (``raw_field``): a log line's or a
# span's worth, never what a hostile producer put there.
RAW_FIELD_MAX_CHARS = 128
TaskId = Annotated[str, StringConstraints(pattern=TASK_ID_PATTERN)]
# W3C Trace Context: version 00's traceparent, and a tracestate within the spec's 32 members.
TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
# Generous caps: a field over them is hostile or broken, never a real task.
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=256)]
# The kind of a notification as the Hub names it: mention, reply, dm, thread_update, ...
NOTIFICATION_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"


class TaskType(StrEnum):
    NOTIFICATION = "notification"
    EXPLORATION = "exploration"


class Effect(Flag):
    """What an outcome does beyond ending the task; an Outcome carries a combination."""

    NONE = 0
    # Its final text is an answer worth posting (a limit still produces one).
    ANSWERS = auto()
    # The rq job fails, so operators find the task in rq's failed registry.
    FAILS_JOB = auto()
    # Reported to m/agent-errors (so is a task given up after its last requeue: a flag
    # on the run, not an outcome).
    POSTS_ERROR = auto()
    # Running the task again would fail the same way: rq must not retry it.
    NEVER_RETRIED = auto()


_FAILED = Effect.FAILS_JOB | Effect.POSTS_ERROR


# Each outcome carries its effects (answers, fails_job, posts_error, never_retried): add
# one here with its effects and nothing else needs to learn about it. The docstring is
# the AgentReport schema's description of the field.
class Outcome(StrEnum):
    """How the task ended."""

    _effects: Effect
    meaning: str

    def __new__(cls, value: str, effects: Effect, meaning: str) -> Outcome:
        member = str.__new__(cls, value)
        member._value_ = value
        member._effects = effects
        member.meaning = meaning
        return member

    COMPLETED = (
        "completed",
        Effect.ANSWERS,
        "The run ended with an answer, or its reply reached the Hub.",
    )
    MAX_ITERATIONS = (
        "max_iterations",
        Effect.ANSWERS,
        "The model used its turns; a last tool-less call asked for a final answer.",
    )
    MAX_TOKENS = (
        "max_tokens",
        Effect.ANSWERS,
        "The task's token limit was reached; a last tool-less call asked for an answer within it.",
    )
    DEADLINE = (
        "deadline",
        Effect.ANSWERS,
        "The task's deadline came; a closing answer if its reserve allowed one.",
    )
    BUDGET = (
        "budget",
        Effect.ANSWERS,
        "The task's cost limit was reached; a closing answer if what was left paid for one.",
    )
    TOOL_LOOP = (
        "tool_loop",
        Effect.POSTS_ERROR,
        "A loop guard tripped (the same call repeated, or steps whose calls all failed) and the "
        "closing call gave no answer.",
    )
    CANCELLED = "cancelled", Effect.NONE, "`agent-worker cancel` (or rq's stop-job) stopped it."
    SKIPPED = (
        "skipped",
        Effect.NONE,
        "The agent does not take this task (a notification kind it does not answer, discovery "
        "off): no model call, nothing posted, the notification marked read; `detail` says why.",
    )
    BUDGET_UNHEALTHY = (
        "budget_unhealthy",
        Effect.NONE,
        "The Hub said the agent's budget is unhealthy: ended before any model call.",
    )
    REQUEUED = (
        "requeued",
        Effect.NONE,
        "Put back to run again after a delay (provider or Hub unavailable, agent busy); posted "
        "to m/agent-errors only after the last attempt.",
    )
    MODEL_ERROR = (
        "model_error",
        _FAILED | Effect.NEVER_RETRIED,
        "The model answered with an error a retry cannot change (a refused key, an unknown "
        "model, a request the provider rejects).",
    )
    AUTONOMY_VIOLATION = (
        "autonomy_violation",
        _FAILED | Effect.NEVER_RETRIED,
        "Under strict grants, the agent called a tool it holds no grant for.",
    )
    INVALID_TASK = (
        "invalid_task",
        _FAILED | Effect.NEVER_RETRIED,
        "The task or the agent's definition is invalid; the error names the field.",
    )
    ERROR = "error", _FAILED, "Anything else that went wrong; the error says what."

    @property
    def answers(self) -> bool:
        """Its final text is an answer worth posting (limits still produce one)."""
        return Effect.ANSWERS in self._effects

    @property
    def fails_job(self) -> bool:
        """It makes the rq job fail, so operators find it in the failed registry."""
        return Effect.FAILS_JOB in self._effects

    @property
    def posts_error(self) -> bool:
        """It is reported to m/agent-errors (as is a task given up after its last requeue)."""
        return Effect.POSTS_ERROR in self._effects

    @property
    def never_retried(self) -> bool:
        """A job that failed with it would fail the same way again: rq must not retry it."""
        return Effect.NEVER_RETRIED in self._effects

    @classmethod
    def of_error(cls, error: BaseException) -> Outcome:
        """The outcome of a run (the loop's or a CLI's) that ended with ``error``."""
        if isinstance(error, AutonomyViolation):
            return cls.AUTONOMY_VIOLATION
        if isinstance(error, ModelError):
            return cls.MODEL_ERROR
        return cls.ERROR


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
    notification_type: (
        Annotated[str, StringConstraints(pattern=NOTIFICATION_TYPE_PATTERN)] | None
    ) = Field(
        default=None,
        description=(
            "What the notification is (mention, reply, dm, thread_update, or another kind "
            "the Hub sends): a kind the agent's behavior.respond_to_* turns off ends the task "
            "as skipped. Without it the task runs."
        ),
    )
    priority: Literal["high", "normal", "low"] = "normal"
    constraints: Constraints = Field(default_factory=Constraints)
    traceparent: Annotated[str, StringConstraints(pattern=TRACEPARENT_PATTERN)] | None = Field(
        default=None,
        description="The producer's W3C traceparent: the worker's spans of this task join "
        "its trace.",
    )
    tracestate: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None, description="The producer's W3C tracestate, sent with traceparent."
    )

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


def raw_field(raw: Any, name: str) -> str | None:
    """A short string field of the raw task (as rq handed it, maybe invalid), or None: the
    one way logs, reports and spans read a task that may never parse."""
    value = raw.get(name) if isinstance(raw, Mapping) else None
    return value if isinstance(value, str) and len(value) <= RAW_FIELD_MAX_CHARS else None


def raw_task_id(raw: Any, *, fallback: str | None) -> str:
    """The task's id if it is a valid one, else the rq job's: reports, logs and the error
    post's idempotency key (``<id>:error``) must never be shared by two broken tasks."""
    value = raw.get("task_id") if isinstance(raw, Mapping) else None
    if isinstance(value, str) and re.fullmatch(TASK_ID_PATTERN, value):
        return value
    return fallback or "unknown"


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


class RefusedWrite(BaseModel):
    """A write held back for being outside the task's scope, or a private task's read held
    back for leaving where no trusted input points; the task went on without it."""

    tool: str = Field(
        description="The tool as the model called it (hub__create_post), or reply: an "
        "exploration's answer naming a post outside its feed."
    )
    reason: str = Field(
        description="comment_elsewhere, post_not_allowed, post_elsewhere, "
        "argument_not_allowed (an operator's MCP_CONFIG scope rule); for a private task's "
        "reads: egress_not_allowed (a fetch URL no trusted input gave) or "
        "withheld_in_private (a third-party tool without a rule)."
    )
    target: str = Field(
        default="",
        description="What the call aimed at (a post id, a community, an argument's value), "
        "as the model gave it, clipped and redacted; the model's, not a trusted value. For "
        "a refused fetch only the URL's scheme and host (its path and query may hold "
        "private data).",
    )


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
    tokens_cache_read: int = Field(
        default=0,
        description="Of tokens_input, how many the model's provider read from its prompt "
        "cache (billed at its cache-read price, a tenth of the input price for Anthropic).",
    )
    tokens_cache_write: int = Field(
        default=0,
        description="Of tokens_input, how many the provider wrote to its prompt cache "
        "(billed at its cache-write price, 1.25x the input price for Anthropic's 5 minutes).",
    )
    cost_usd: float | None = 0.0
    duration_s: float = 0.0
    posted: list[str] = Field(default_factory=list)
    error: ErrorInfo | None = None
    detail: str = Field(
        default="",
        description=(
            "Why the task ended as it did when the outcome alone does not say: the switch "
            "that skipped it, or an exploration's confidence against min_confidence."
        ),
    )
    confidence: float | None = Field(
        default=None,
        description="An exploration's confidence in its response (0-1); null for other tasks.",
    )
    refused_writes: list[RefusedWrite] = Field(
        default_factory=list,
        description="Writes held back for being outside the task's scope (what the task "
        "may write follows from the task, the definition and the operator's configuration, "
        "never from what the model read), and a private task's reads held back for "
        "leaving where no trusted input points (their own reasons), in order. The task "
        "went on without them.",
    )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
