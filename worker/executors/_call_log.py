"""The call log: what ``mcp_servers.gateway`` tells the CLI executor about one task.

The gateway appends one JSON line per event (``CallLogWriter``); the executor reads
them while the CLI runs and once it is done (``read_call_log``): each tool call as a
``ToolCallRecord``, each grant denial, the pids of the processes the gateway started,
the Hub writes a write cap held back, the writes the task's scope held back, and a
strict-grants violation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from worker.hub_writes import RefusalReason, WriteKind, WriteRefused
from worker.loop import ToolCallRecord, ToolOutcome
from worker.tools import ScopeReason, ScopeRefusal


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

    def scope_refused(self, refusal: ScopeRefusal) -> None:
        self._write(
            {
                "event": "scope_refused",
                "tool": refusal.tool,
                "reason": refusal.reason.value,
                "message": refusal.message,
                "target": refusal.target,
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
    # Writes the task's scope held back.
    scope_refusals: list[ScopeRefusal] = field(default_factory=list)
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
    into.scope_refusals.extend(more.scope_refusals)
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
        elif event == "scope_refused":
            activity.scope_refusals.append(
                ScopeRefusal(
                    tool=str(entry["tool"]),
                    reason=ScopeReason(entry["reason"]),
                    message=str(entry["message"]),
                    target=str(entry["target"]),
                )
            )
        elif event == "autonomy_violation" and activity.violation is None:
            activity.violation = str(entry["message"])
    except (ValueError, KeyError, TypeError):
        return
