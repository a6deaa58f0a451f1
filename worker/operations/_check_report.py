"""What ``agent-worker check`` found: problems by severity, and what was looked at."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One finding; ``agent`` is set when it concerns only that agent's tasks."""

    severity: Severity
    subject: str
    message: str
    agent: str | None = None

    def line(self) -> str:
        return f"{self.severity.value}: {self.subject}: {self.message}"


@dataclass(kw_only=True)
class CheckReport:
    problems: list[Problem] = field(default_factory=list)
    # What was looked at and found in order, e.g. "3 agents", for the summary line.
    checked: list[str] = field(default_factory=list)
    # Each loaded agent's effective values, schema defaults applied (``--json`` only).
    effective_agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per agent that can send a read outside: when its tasks are private and where their
    # reads may then go (docs/task-scope.md).
    reach: list[str] = field(default_factory=list)
    # The model providers the loaded agents name (fallbacks included): a worker loads
    # their SDKs before it forks job processes, and only theirs.
    providers: set[str] = field(default_factory=set)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.WARNING]

    def error(self, subject: str, message: str, *, agent: str | None = None) -> None:
        self.problems.append(
            Problem(severity=Severity.ERROR, subject=subject, message=message, agent=agent)
        )

    def warning(self, subject: str, message: str, *, agent: str | None = None) -> None:
        self.problems.append(
            Problem(severity=Severity.WARNING, subject=subject, message=message, agent=agent)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.errors,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [asdict(problem) for problem in self.problems],
            "checked": self.checked,
            "reach": self.reach,
            "agents": self.effective_agents,
        }
