"""What one run of a task knows so far, and what it hands back to rq.

``RunState`` is filled step by step (task, agent, deadline, result, outcome); the
report and the verdict are read from it at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hub_client import Post
from worker.agents import AgentDefinition
from worker.coordination import TaskDeadline
from worker.loop import RunResult
from worker.task import AgentReport, Outcome, Task
from worker.tools import ScopeCell, ScopeRefusal


@dataclass(frozen=True, kw_only=True)
class Requeue:
    """Put the same task back after ``delay_s``, as run number ``attempt``, because ``reason``
    (shown by ``agent-worker status`` and ``report`` while the task waits)."""

    delay_s: float
    attempt: int
    reason: str = ""

    def to_meta(self) -> dict[str, float | int | str]:
        """The form the worker parent reads from ``job.meta["requeue"]``."""
        return {"delay_s": self.delay_s, "attempt": self.attempt, "reason": self.reason}


@dataclass(kw_only=True)
class TaskVerdict:
    """The report plus what the rq side must do with it."""

    report: AgentReport
    next_run: Requeue | None = None

    @property
    def requeue(self) -> dict[str, float | int | str] | None:
        """The requeue as stored in ``job.meta["requeue"]``, or None to end the task here."""
        return None if self.next_run is None else self.next_run.to_meta()


@dataclass
class RunState:
    """Filled by the run's steps; read by the report, the settling and the verdict."""

    task: Task | None = None
    agent: AgentDefinition | None = None
    result: RunResult | None = None
    outcome: Outcome = Outcome.ERROR
    error: BaseException | None = None
    posted: list[str] = field(default_factory=list)
    requeue: Requeue | None = None
    # The last requeue was used up: the task ends as a model error, reported to m/agent-errors.
    given_up: bool = False
    # Fixed once the task holds its leases; every Hub, MCP and model call ends by it.
    deadline: TaskDeadline | None = None
    # Why the task ended as it did, when the outcome does not say (the report's ``detail``).
    detail: str = ""
    # An exploration's confidence in its response (the report's ``confidence``).
    confidence: float | None = None
    # The notification's thread as the task read it (what memory keeps of the exchange).
    thread: Post | None = None
    # The audiences of the memories recall put into the prompt.
    recalled_audiences: frozenset[str] = frozenset()
    # Tokens the memory's embeddings calls spent: input tokens of the task like the model's.
    memory_tokens: int = 0
    # Where the task may write: nothing until its thread or feed is read (``_scope``).
    scope: ScopeCell = field(default_factory=ScopeCell)
    # Writes held back for being outside that scope, in order (the report's refused_writes).
    refused_writes: list[ScopeRefusal] = field(default_factory=list)

    def hub_timeout_s(self, cap_s: float) -> float:
        """A Hub call's timeout: the task's remaining time, capped by the call's default."""
        return cap_s if self.deadline is None else self.deadline.timeout_s(cap_s)
