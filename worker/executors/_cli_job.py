"""What one CLI run is built from: its run directory, the job a command line is made of,
the invocation a subclass returns, and the prompt and deadline they carry.

    run directory (0711)                     inside the sandbox
    ├── workspace/      the CLI's cwd, HOME  a size-capped tmpfs at the same path
    ├── cli/            prompt files, MCP    read-only
    │                   config, helper,
    │                   the two sockets
    ├── gateway-home/   the gateway's and    never mounted: npm logs, caches and token
    │                   its servers' HOME    stores of the tool servers stay outside
    └── gateway-calls.jsonl                  never mounted
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker.agents import AgentDefinition
from worker.executors._base import ExecutionRequest
from worker.executors._cli_gateway import GatewayLaunch
from worker.executors._provider import ProviderAccess
from worker.executors._sandbox import HELPER, Sandbox
from worker.models import Message


@dataclass(frozen=True, slots=True, kw_only=True)
class CliJob:
    """What one CLI command line is built from."""

    request: ExecutionRequest
    # In the sandbox: the relay's URL and a placeholder key (the relay adds the real one).
    access: ProviderAccess
    executable: str
    # The CLI's working directory and HOME; removed after the run.
    workspace: Path
    # Files the CLI reads but cannot change (prompt, settings, MCP config); removed after.
    private: Path
    prompt: str
    system: str
    max_turns: int
    max_cost_usd: float | None
    # None: the agent has no tools in this task (no MCP_CONFIG, or no grant).
    gateway: GatewayLaunch | None

    @classmethod
    def of(
        cls,
        request: ExecutionRequest,
        access: ProviderAccess,
        executable: str,
        run: RunDirectory,
        *,
        gateway: GatewayLaunch | None,
    ) -> CliJob:
        limits = request.settings.limits
        return cls(
            request=request,
            access=access,
            executable=executable,
            workspace=run.workspace,
            private=run.private,
            prompt=render_prompt(request.messages),
            system=request.full_system(),
            max_turns=limits.max_iterations,
            max_cost_usd=limits.max_cost_usd,
            gateway=gateway,
        )

    @property
    def agent(self) -> AgentDefinition:
        return self.request.agent


@dataclass(slots=True, kw_only=True)
class CliInvocation:
    argv: list[str]
    # Added to the minimal environment (PATH, LANG, HOME): the credential and CLI switches.
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDirectory:
    """One run's files (the module's drawing): ``workspace`` and ``private`` are what the
    sandbox sees; ``gateway_home`` and ``root`` itself never enter it."""

    root: Path
    workspace: Path
    private: Path
    gateway_home: Path

    @classmethod
    def create(cls, root: Path, sandbox: Sandbox | None) -> RunDirectory:
        root.chmod(0o711)  # the sandbox's user passes through to its two directories
        run = cls(
            root=root,
            workspace=root / "workspace",
            private=root / "cli",
            gateway_home=root / "gateway-home",
        )
        run.workspace.mkdir()
        run.private.mkdir()
        run.gateway_home.mkdir(mode=0o700)
        helper = run.private / HELPER.name
        shutil.copyfile(HELPER, helper)
        helper.chmod(0o644)
        if sandbox is not None:
            sandbox.prepare(run.workspace, run.private)
        return run


def task_deadline_epoch(request: ExecutionRequest) -> float:
    """When the CLI must be over (epoch seconds): the task's deadline, fixed at its first
    start and kept across re-runs, so a re-run gets what is left, not a fresh duration."""
    fresh = time.time() + request.settings.limits.max_duration_s
    kept = request.settings.deadline_epoch
    return fresh if kept is None else min(kept, fresh)


def render_prompt(messages: Sequence[Message]) -> str:
    """The task's conversation as one prompt. The first user message already wraps the
    thread as untrusted content; later messages (steering) follow under their role."""
    if len(messages) == 1 and messages[0].role == "user":
        return messages[0].content
    sections = []
    for message in messages:
        if message.role == "tool":
            continue
        sections.append(f"[{message.role}]\n{message.content}")
    return "\n\n".join(sections)
