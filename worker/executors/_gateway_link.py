"""The contract between a CLI executor and ``mcp_servers.gateway``: the environment block.

The executor starts the gateway (``worker.executors._cli_gateway``) with everything it
needs in its environment (``GatewaySpec.environment``); the gateway writes what
happened into a call log the executor reads (``worker.executors._call_log``).

The block holds no secret: ``MCP_AUTH_TOKEN``, tool credentials, the task's capability
and the write caps' Redis reach the gateway on its stdin (``--socket``, how the
executors start it) or, run by hand over ``--stdio``, from the file ``GATEWAY_SECRETS_FILE``
names (``worker.executors._gateway_secrets``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from worker.tools import TaskScope

AGENT_ID = "GATEWAY_AGENT_ID"
TASK_ID = "GATEWAY_TASK_ID"
GRANTS = "GATEWAY_GRANTS"
DENIED_GRANTS = "GATEWAY_DENIED_GRANTS"
ALLOWED_TOOLS = "GATEWAY_ALLOWED_TOOLS"
SERVERS = "GATEWAY_SERVERS"
STRICT_GRANTS = "GATEWAY_STRICT_GRANTS"
DEADLINE = "GATEWAY_DEADLINE"
TOOL_TIMEOUT_S = "GATEWAY_TOOL_TIMEOUT_S"
MAX_OUTPUT_CHARS = "GATEWAY_MAX_OUTPUT_CHARS"
CALL_LOG = "GATEWAY_CALL_LOG"
SECRETS_FILE = "GATEWAY_SECRETS_FILE"
WORKDIR = "GATEWAY_WORKDIR"
CAN_EXECUTE_TOOL = "GATEWAY_CAN_EXECUTE_TOOL"
UNTRUSTED_NONCE = "GATEWAY_UNTRUSTED_NONCE"
# Where the task may write (TaskScope.to_claim as JSON): the capability's, when there is one.
SCOPE = "GATEWAY_SCOPE"
# The MCP_CONFIG server that is mcp-web (WEB_TOOL_SERVER): a private task's fetch is bounded.
WEB_SERVER = "GATEWAY_WEB_SERVER"
MCP_CONFIG = "MCP_CONFIG"
# "1" when the worker signs capabilities: the gateway then refuses to run without one.
REQUIRE_CAPABILITY = "GATEWAY_REQUIRE_CAPABILITY"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySpec:
    """One task's gateway: who calls, what it may call, until when, and where to report."""

    agent_id: str
    task_id: str
    mcp_config: Path
    call_log: Path
    grants: tuple[str, ...]
    denied_grants: tuple[str, ...] = ()
    # None: no narrowing; the task's ``allowed_tools`` and the agent's ``mcp_servers``.
    allowed_tools: tuple[str, ...] | None = None
    servers: tuple[str, ...] | None = None
    strict_grants: bool = False
    # Wall-clock (epoch) end of the task: each call gets the time left, capped.
    deadline_epoch_s: float
    tool_timeout_s: float = 60.0
    max_output_chars: int = 20_000
    secrets_file: Path | None = None
    # The worker's working directory, so stdio servers start where they would for `native`.
    workdir: Path | None = None
    # The worker signs capabilities (CAPABILITY_KEY): the gateway needs one to act.
    require_capability: bool = False
    # The operator's CAN_EXECUTE_TOOL import path; the gateway loads it and asks it per call.
    can_execute_tool: str | None = None
    # The nonce of the task's untrusted-content delimiters: tool results are wrapped in them.
    untrusted_nonce: str | None = None
    # Where the task may write; None: a gateway started by hand, bounded by grants alone.
    scope: TaskScope | None = None
    web_server: str = "web"

    def environment(self) -> dict[str, str]:
        """The gateway's environment block (no secrets: the CLI can read it)."""
        env = {
            AGENT_ID: self.agent_id,
            TASK_ID: self.task_id,
            MCP_CONFIG: str(self.mcp_config),
            CALL_LOG: str(self.call_log),
            GRANTS: _compact(self.grants),
            DENIED_GRANTS: _compact(self.denied_grants),
            STRICT_GRANTS: "1" if self.strict_grants else "0",
            DEADLINE: f"{self.deadline_epoch_s:.3f}",
            TOOL_TIMEOUT_S: f"{self.tool_timeout_s:g}",
            MAX_OUTPUT_CHARS: str(self.max_output_chars),
            WEB_SERVER: self.web_server,
        }
        if self.allowed_tools is not None:
            env[ALLOWED_TOOLS] = _compact(self.allowed_tools)
        if self.servers is not None:
            env[SERVERS] = _compact(self.servers)
        if self.secrets_file is not None:
            env[SECRETS_FILE] = str(self.secrets_file)
        if self.workdir is not None:
            env[WORKDIR] = str(self.workdir)
        if self.require_capability:
            env[REQUIRE_CAPABILITY] = "1"
        if self.can_execute_tool is not None:
            env[CAN_EXECUTE_TOOL] = self.can_execute_tool
        if self.untrusted_nonce is not None:
            env[UNTRUSTED_NONCE] = self.untrusted_nonce
        if self.scope is not None:
            env[SCOPE] = json.dumps(self.scope.to_claim(), separators=(",", ":"))
        return env

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> GatewaySpec:
        """Read the block back; ValueError names the first missing or malformed variable."""
        return cls(
            agent_id=_required(env, AGENT_ID),
            task_id=_required(env, TASK_ID),
            mcp_config=Path(_required(env, MCP_CONFIG)),
            call_log=Path(_required(env, CALL_LOG)),
            grants=_string_list(env, GRANTS) or (),
            denied_grants=_string_list(env, DENIED_GRANTS) or (),
            allowed_tools=_string_list(env, ALLOWED_TOOLS),
            servers=_string_list(env, SERVERS),
            strict_grants=env.get(STRICT_GRANTS, "0") == "1",
            deadline_epoch_s=_number(env, DEADLINE),
            tool_timeout_s=_number(env, TOOL_TIMEOUT_S, default=60.0),
            max_output_chars=int(_number(env, MAX_OUTPUT_CHARS, default=20_000)),
            secrets_file=Path(env[SECRETS_FILE]) if env.get(SECRETS_FILE) else None,
            workdir=Path(env[WORKDIR]) if env.get(WORKDIR) else None,
            require_capability=env.get(REQUIRE_CAPABILITY) == "1",
            can_execute_tool=env.get(CAN_EXECUTE_TOOL) or None,
            untrusted_nonce=env.get(UNTRUSTED_NONCE) or None,
            scope=_scope(env),
            web_server=env.get(WEB_SERVER) or "web",
        )


def _scope(env: Mapping[str, str]) -> TaskScope | None:
    raw = env.get(SCOPE)
    if not raw:
        return None
    try:
        return TaskScope.from_claim(json.loads(raw))
    except ValueError as exc:  # JSONDecodeError is one
        raise ValueError(f"{SCOPE} is not a task scope: {exc}") from None


def _compact(values: tuple[str, ...]) -> str:
    # No spaces: goose splits its extension command line on whitespace.
    return json.dumps(list(values), separators=(",", ":"))


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise ValueError(f"{name} is not set")
    return value


def _string_list(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        values = json.loads(raw)
    except json.JSONDecodeError:
        values = None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{name} must be a JSON array of strings")
    return tuple(values)


def _number(env: Mapping[str, str], name: str, default: float | None = None) -> float:
    raw = env.get(name)
    if raw is None and default is not None:
        return default
    try:
        return float(raw or "")
    except ValueError:
        raise ValueError(f"{name} must be a number") from None
