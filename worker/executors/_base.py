"""Executors run one task for an agent and return the same RunResult, whatever runs inside.

``native`` is our loop; the CLI executors (claude-code, goose, aider, opencode)
run a coding-agent CLI that owns its loop. Each overrides only ``run``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import ClassVar

from worker._hooks import allow_every_tool
from worker._spawn import SpawnHook, ignore_spawn
from worker.agents import AgentDefinition
from worker.hub_writes import RefusalHandler, ignore_refusals
from worker.loop import (
    NO_CONTROL,
    CanExecuteTool,
    ControlSource,
    Journal,
    JournalEntry,
    LoopObserver,
    LoopSettings,
    RunResult,
)
from worker.models import Message, Model, joined_system
from worker.settings import Settings
from worker.task import Task
from worker.tools import EffectiveGrants, ScopeRefusal, TaskScope, Toolbox


def _ignore_refusal(refusal: ScopeRefusal) -> None:
    """Nobody logs or counts scope refusals (a request built outside the pipeline)."""


@dataclass(slots=True, kw_only=True)
class ExecutionRequest:
    """Everything an executor reads: it never looks up settings or policies itself."""

    task: Task
    agent: AgentDefinition
    # The agent's prompt and skills: the same in every task of the agent (prompt caches).
    system: str
    messages: list[Message]
    settings: LoopSettings
    # The worker's configuration: provider keys and endpoints, MCP_CONFIG, MCP_AUTH_TOKEN,
    # CAPABILITY_KEY, write caps, CAN_EXECUTE_TOOL (CLI executors hand them to the gateway).
    worker_settings: Settings
    # The agent's grants as GRANT_POLICY caps them: what its tools may do in this task.
    grants: EffectiveGrants
    # Opens the agent's grant-checked tools for this task (and closes them on exit).
    open_toolbox: Callable[[], AbstractAsyncContextManager[Toolbox]]
    # Builds the agent's model; called only by executors that talk to the provider themselves.
    make_model: Callable[[], Model]
    observers: Sequence[LoopObserver] = ()
    control: ControlSource = NO_CONTROL
    journal: Journal | None = None
    resume: Sequence[JournalEntry] = field(default_factory=list)
    # Called with the pid of every process the executor starts (killed after a hard crash).
    on_spawn: SpawnHook = ignore_spawn
    # Told of each Hub write a CLI's gateway held back for a write cap (the native loop's
    # toolbox tells its own).
    on_write_refused: RefusalHandler = ignore_refusals
    # The operator's CAN_EXECUTE_TOOL check (CLI executors: the gateway loads it itself).
    can_execute_tool: CanExecuteTool = allow_every_tool
    # The nonce of the untrusted-content blocks in ``system`` and ``messages`` (the CLI
    # gateway wraps tool results in the same blocks); None: tool results are not wrapped.
    untrusted_nonce: str | None = None
    # Where the task may write (CLI executors sign it into the gateway's capability).
    scope: TaskScope = field(default_factory=TaskScope.nothing)
    # Told of each write a CLI's gateway held back for the scope (the native loop's
    # toolbox tells its own).
    on_scope_refused: Callable[[ScopeRefusal], None] = _ignore_refusal
    # This task's own instructions, read after ``system``: the untrusted-content notice with
    # its nonce, the budget line.
    system_context: str = ""

    def full_system(self) -> str:
        """The system prompt as one text, for a CLI that takes one."""
        return joined_system(self.system, self.system_context)


class Executor:
    """Base of all executors. Subclasses override ``run`` only."""

    name: str = ""
    # Whether ``run`` opens ``request.open_toolbox``: the pipeline then opens it early,
    # while it reads the Hub (a CLI executor runs its own gateway instead).
    uses_toolbox: ClassVar[bool] = False

    async def run(self, request: ExecutionRequest) -> RunResult:
        raise NotImplementedError


class NativeExecutor(Executor):
    """Our reason → tool → observe loop, with tools from the grant-checked MCP layer."""

    name = "native"
    uses_toolbox = True

    async def run(self, request: ExecutionRequest) -> RunResult:
        from worker.loop import AgentLoop

        async with request.open_toolbox() as toolbox:
            loop = AgentLoop(
                model=request.make_model(),
                toolbox=toolbox,
                system=request.system,
                system_context=request.system_context,
                settings=request.settings,
                task_id=request.task.task_id,
                agent_id=request.agent.config.name,
                observers=request.observers,
                control=request.control,
                journal=request.journal,
                can_execute_tool=request.can_execute_tool,
            )
            return await loop.run(request.messages, resume=request.resume)
