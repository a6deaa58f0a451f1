"""What the loop needs from tools: a Toolbox that offers, resolves and calls them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from worker.models import ToolSpec


@dataclass(slots=True, kw_only=True, frozen=True)
class ToolResult:
    """What the model reads back. ``is_error`` results still go to the model."""

    content: str
    is_error: bool = False
    # Not run: the worker's own policy held it back (a write cap), not the tool.
    refused: bool = False


@dataclass(slots=True, kw_only=True, frozen=True)
class CallContext:
    """Who is calling and how long the call may take; never chosen by the model."""

    task_id: str
    agent_id: str
    step: int
    index: int
    timeout_s: float
    # The task's absolute deadline (epoch seconds), fixed at its first start and kept across
    # re-runs; None outside a task. A server may stop work that would outlive it.
    deadline_epoch: float | None = None

    @property
    def idempotency_key(self) -> str:
        return f"{self.task_id}:tool:{self.step}:{self.index}"

    def with_deadline(self, deadline_epoch: float | None) -> CallContext:
        """This context with the task's deadline (``dataclasses.replace``, without its
        per-call field lookups: it runs for every tool call). A subclass (a context with a
        key of its own) goes through ``replace``, so it keeps its class and fields."""
        if type(self) is not CallContext:
            return dataclasses.replace(self, deadline_epoch=deadline_epoch)
        return CallContext(
            task_id=self.task_id,
            agent_id=self.agent_id,
            step=self.step,
            index=self.index,
            timeout_s=self.timeout_s,
            deadline_epoch=deadline_epoch,
        )

    def meta(self) -> dict[str, Any]:
        """The MCP request ``_meta`` our servers read the caller from."""
        return {
            "agent_id": self.agent_id,
            "task_id": self.task_id,
            "idempotency_key": self.idempotency_key,
        }


@dataclass(slots=True, kw_only=True, frozen=True)
class Granted:
    spec: ToolSpec
    server: str


@dataclass(slots=True, kw_only=True, frozen=True)
class MissingGrant:
    """The tool exists, but the agent does not hold ``required_grant``; ``strict``: the
    agent's grants are strict, so the call ends the task."""

    name: str
    required_grant: str
    strict: bool = False


@dataclass(slots=True, kw_only=True, frozen=True)
class NotAllowed:
    """The tool exists, but the task's ``constraints.allowed_tools`` leaves it out;
    ``strict``: the agent's grants are strict, so the call ends the task."""

    name: str
    strict: bool = False


Resolution = Granted | MissingGrant | NotAllowed | None


class Toolbox(Protocol):
    """Tools for one task. ``resolve`` returning None means the tool does not exist."""

    def offered(self) -> Sequence[ToolSpec]:
        """Tools the model may see now (a dead server's tools are withdrawn)."""
        ...

    def resolve(self, name: str) -> Resolution: ...

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        """Run a granted tool; raise ``ToolFailed`` subclasses for failures the model reads."""
        ...


class ToolboxWrapper:
    """A Toolbox that hands everything to ``inner``: the base of each layer around the tools.

    Use it for one concern on the way to the tools (the deadline, the intent journal, write
    caps, redaction): a subclass overrides only ``call`` and reaches the wrapped toolbox as
    ``self._inner``; what the model is offered and how a name resolves stay the inner one's.
    """

    def __init__(self, inner: Toolbox) -> None:
        self._inner = inner

    def offered(self) -> Sequence[ToolSpec]:
        return self._inner.offered()

    def resolve(self, name: str) -> Resolution:
        return self._inner.resolve(name)

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        return await self._inner.call(name, arguments, ctx)
