"""The contract between a CLI executor and ``mcp_servers.gateway``, in both directions.

The executor never talks to the gateway: the CLI starts it as its only MCP server.
So the executor writes everything the gateway needs into the environment block of
the CLI's MCP configuration (``GatewaySpec.environment``), and the gateway writes
what happened into a call log (JSON lines) that the executor reads when the CLI is
done (``read_call_log``): each tool call as a ``ToolCallRecord``, each grant
denial, the pids of the processes it started, and a strict-grants violation.

Secrets (``MCP_AUTH_TOKEN``, the tool credentials ``MCP_CONFIG`` references as
``${VAR}``, and the task's signed capability) never go into that block, which the
CLI can read: they go into a file only the worker's user can read
(``GATEWAY_SECRETS_FILE``), loaded by the gateway into its own environment before
it reads ``MCP_CONFIG``. The gateway gets the capability, never ``CAPABILITY_KEY``:
with the key, whatever can read that file could sign for any agent.

The agent's write caps ride in that file too (``GatewayWriteCaps``): the fleet's Redis
(a credential) and the caps, so the gateway counts the CLI's Hub writes in the same
Redis counters as the native loop. A write it holds back is a ``write_refused`` line
of the call log, which the worker logs and counts as it does its own.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from worker.loop import ToolCallRecord, ToolOutcome
from worker.write_caps import RefusalReason, WriteCaps, WriteKind, WriteRefused

# The gateway imports this module at every start: what only the worker side, or only a
# gateway with write caps, uses is imported where it is used.
if TYPE_CHECKING:
    from redis import Redis

    from worker.settings import Settings
    from worker.tools import EffectiveGrants

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
MCP_CONFIG = "MCP_CONFIG"
MCP_AUTH_TOKEN = "MCP_AUTH_TOKEN"
# In the secrets file: the task's capability, forwarded to first-party servers.
CAPABILITY = "GATEWAY_CAPABILITY"
# "1" when the worker signs capabilities: the gateway then refuses to run without one.
REQUIRE_CAPABILITY = "GATEWAY_REQUIRE_CAPABILITY"
# In the secrets file: the fleet's Redis and the agent's write caps (``GatewayWriteCaps``).
WRITE_CAPS = "GATEWAY_WRITE_CAPS"

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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
        )


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


def referenced_variables(mcp_config: Path) -> list[str]:
    """Names of the ``${VAR}`` the MCP configuration file expands (its tool credentials)."""
    try:
        text = mcp_config.read_text(encoding="utf-8")
    except OSError:
        return []
    return sorted(set(_ENV_REFERENCE.findall(text)))


def gateway_secrets(mcp_config: Path, settings: Settings) -> dict[str, str]:
    """MCP_AUTH_TOKEN and the tool credentials MCP_CONFIG references, from the worker: what
    the secrets file hands the gateway, and what the executor masks in its report."""
    secrets = {
        name: os.environ[name] for name in referenced_variables(mcp_config) if name in os.environ
    }
    token = settings.mcp_auth_token
    if token is not None and token.get_secret_value():
        secrets[MCP_AUTH_TOKEN] = token.get_secret_value()
    return secrets


def gateway_capability(
    capability_key: SecretStr | None,
    *,
    agent_id: str,
    task_id: str,
    grants: EffectiveGrants,
    deadline_epoch_s: float,
) -> dict[str, str]:
    """The secrets-file entry carrying the task's capability; empty without a key."""
    if capability_key is None:
        return {}
    from worker.tools import mint_capability

    token = mint_capability(
        capability_key.get_secret_value(),
        agent_id=agent_id,
        task_id=task_id,
        grants=grants,
        expires_at=deadline_epoch_s,
    )
    return {CAPABILITY: token}


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayWriteCaps:
    """What the gateway needs to hold the agent's write caps: where the fleet counts them
    (Redis, as the worker connects to it) and the caps. Only ever in the secrets file."""

    caps: WriteCaps
    hub_server: str
    redis_url: str
    redis_sentinels: str | None = None
    redis_sentinel_master: str = "mymaster"
    redis_sentinel_password: str | None = None

    @classmethod
    def of(cls, settings: Settings, caps: WriteCaps) -> GatewayWriteCaps:
        password = settings.redis_sentinel_password
        return cls(
            caps=caps,
            hub_server=settings.hub_tool_server,
            redis_url=settings.redis_url,
            redis_sentinels=settings.redis_sentinels,
            redis_sentinel_master=settings.redis_sentinel_master,
            redis_sentinel_password=password.get_secret_value() if password else None,
        )

    def secrets(self) -> dict[str, str]:
        """The secrets-file entry."""
        caps = self.caps
        fields = {
            "max_daily_posts": caps.max_daily_posts,
            "max_daily_comments": caps.max_daily_comments,
            "min_interval_s": caps.min_interval_s,
            "max_writes_per_post": caps.max_writes_per_post,
            "hub_server": self.hub_server,
            "redis_url": self.redis_url,
            "redis_sentinels": self.redis_sentinels,
            "redis_sentinel_master": self.redis_sentinel_master,
            "redis_sentinel_password": self.redis_sentinel_password,
        }
        return {WRITE_CAPS: json.dumps(fields)}

    @classmethod
    def pop_from(cls, secrets: dict[str, str]) -> GatewayWriteCaps | None:
        """Take the entry out of the secrets (it is no variable for the gateway's
        environment); None without one. ValueError when it is malformed."""
        raw = secrets.pop(WRITE_CAPS, None)
        if raw is None:
            return None
        try:
            fields: Any = json.loads(raw)
            return cls(
                caps=WriteCaps(
                    max_daily_posts=_optional_int(fields["max_daily_posts"]),
                    max_daily_comments=_optional_int(fields["max_daily_comments"]),
                    min_interval_s=_optional_float(fields["min_interval_s"]),
                    max_writes_per_post=int(fields["max_writes_per_post"]),
                ),
                hub_server=str(fields["hub_server"]),
                redis_url=str(fields["redis_url"]),
                redis_sentinels=fields.get("redis_sentinels") or None,
                redis_sentinel_master=str(fields.get("redis_sentinel_master") or "mymaster"),
                redis_sentinel_password=fields.get("redis_sentinel_password") or None,
            )
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{WRITE_CAPS} in the secrets file is malformed") from None

    def secret_values(self) -> list[str]:
        """What the gateway must mask: the Redis URL, its password and the sentinels'."""
        url_password = urlsplit(self.redis_url).password
        values = (self.redis_url, url_password, self.redis_sentinel_password)
        return [value for value in values if value]

    def connect(self) -> Redis:
        """A client to the fleet's Redis, built as the worker builds its own."""
        from worker.redis_connection import connect
        from worker.settings import Settings

        password = self.redis_sentinel_password
        # Only the connection fields: the gateway has none of the worker's other settings.
        settings = Settings.model_construct(
            redis_url=self.redis_url,
            redis_sentinels=self.redis_sentinels,
            redis_sentinel_master=self.redis_sentinel_master,
            redis_sentinel_password=SecretStr(password) if password else None,
        )
        return connect(settings)


def _optional_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _optional_float(value: object) -> float | None:
    return None if value is None else float(str(value))


def write_secrets_file(path: Path, secrets: Mapping[str, str]) -> None:
    """Write ``secrets`` as JSON that only this user can read."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        json.dump(dict(secrets), file)


def read_secrets_file(path: Path) -> dict[str, str]:
    values: Any = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return {str(key): str(value) for key, value in values.items()}


# --- the call log ------------------------------------------------------------------------------


class CallLogWriter:
    """The gateway's side: one JSON line per event, flushed at once (the CLI may be killed)."""

    def __init__(self, path: Path) -> None:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file: IO[str] = os.fdopen(descriptor, "a", encoding="utf-8")

    def started(self, pid: int) -> None:
        self._write({"event": "gateway_started", "pid": pid})

    def spawned(self, pid: int) -> None:
        self._write({"event": "server_spawned", "pid": pid})

    def tool_call(self, step: int, record: ToolCallRecord) -> None:
        self._write(
            {
                "event": "tool_call",
                "step": step,
                "call_id": record.call_id,
                "name": record.name,
                "arguments": record.arguments,
                "server": record.server,
                "outcome": record.outcome,
                "is_error": record.is_error,
                "content": record.content,
                "duration_s": record.duration_s,
            }
        )

    def grant_denied(self, step: int, tool: str, required_grant: str) -> None:
        self._write(
            {"event": "grant_denied", "step": step, "tool": tool, "required_grant": required_grant}
        )

    def write_refused(self, refusal: WriteRefused, via: str) -> None:
        self._write(
            {
                "event": "write_refused",
                "via": via,
                "kind": refusal.kind.value,
                "reason": refusal.reason.value,
                "message": refusal.message,
            }
        )

    def autonomy_violation(self, step: int, message: str) -> None:
        self._write({"event": "autonomy_violation", "step": step, "message": message})

    def close(self) -> None:
        self._file.close()

    def _write(self, entry: dict[str, Any]) -> None:
        # One write per line: concurrent appends from two gateways never interleave.
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._file.flush()


@dataclass(frozen=True, slots=True, kw_only=True)
class Denial:
    step: int
    tool: str
    required_grant: str


@dataclass(slots=True, kw_only=True)
class GatewayActivity:
    """What the gateway reported for one task, in the order it happened."""

    calls: list[ToolCallRecord] = field(default_factory=list)
    denials: list[Denial] = field(default_factory=list)
    gateway_pids: list[int] = field(default_factory=list)
    server_pids: list[int] = field(default_factory=list)
    # Hub writes a write cap held back: (the refusal, the tool name).
    refusals: list[tuple[WriteRefused, str]] = field(default_factory=list)
    violation: str | None = None


def read_call_log(path: Path, *, offset: int = 0) -> tuple[GatewayActivity, int]:
    """The activity logged from byte ``offset`` on, and the offset after the last whole line.

    A line still being written (no newline yet) is left for the next read; a line
    that is not a known event is skipped rather than failing the task.
    """
    activity = GatewayActivity()
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read()
    except FileNotFoundError:
        return activity, offset
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.splitlines():
        _apply(activity, line)
    return activity, offset + len(complete)


def merge(into: GatewayActivity, more: GatewayActivity) -> None:
    into.calls.extend(more.calls)
    into.denials.extend(more.denials)
    into.gateway_pids.extend(more.gateway_pids)
    into.server_pids.extend(more.server_pids)
    into.refusals.extend(more.refusals)
    into.violation = into.violation or more.violation


def _apply(activity: GatewayActivity, line: bytes) -> None:
    try:
        entry: Any = json.loads(line)
        event = entry["event"]
        if event == "tool_call":
            activity.calls.append(
                ToolCallRecord(
                    call_id=str(entry["call_id"]),
                    name=str(entry["name"]),
                    arguments=str(entry["arguments"]),
                    server=str(entry["server"]),
                    outcome=ToolOutcome(entry["outcome"]),
                    is_error=bool(entry["is_error"]),
                    content=str(entry["content"]),
                    duration_s=float(entry["duration_s"]),
                )
            )
        elif event == "grant_denied":
            activity.denials.append(
                Denial(
                    step=int(entry["step"]),
                    tool=str(entry["tool"]),
                    required_grant=str(entry["required_grant"]),
                )
            )
        elif event == "gateway_started":
            activity.gateway_pids.append(int(entry["pid"]))
        elif event == "server_spawned":
            activity.server_pids.append(int(entry["pid"]))
        elif event == "write_refused":
            refusal = WriteRefused(
                kind=WriteKind(entry["kind"]),
                reason=RefusalReason(entry["reason"]),
                message=str(entry["message"]),
            )
            activity.refusals.append((refusal, str(entry["via"])))
        elif event == "autonomy_violation" and activity.violation is None:
            activity.violation = str(entry["message"])
    except (ValueError, KeyError, TypeError):
        return


def gateway_command() -> list[str]:
    """How a CLI starts the gateway: this interpreter, the module, over stdio."""
    return [sys.executable, "-m", "mcp_servers.gateway", "--stdio"]


def gateway_python_path() -> str:
    """The directory holding ``mcp_servers`` and ``worker``, for the gateway's PYTHONPATH.

    The CLI starts the gateway in the task's scratch directory: without it, a worker
    run from a source checkout (not installed) could not import the gateway there.
    """
    import mcp_servers

    return str(Path(mcp_servers.__file__).resolve().parent.parent)
