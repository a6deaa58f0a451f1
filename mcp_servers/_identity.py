"""Who is calling a tool: read from the MCP request ``_meta`` that the worker sets.

The worker calls ``ClientSession.call_tool(name, arguments, meta={"agent_id": ...,
"task_id": ..., "idempotency_key": ...})``. These are not tool parameters, so the
model can neither see nor choose them. Read tools may use the caller when present;
write tools call ``require_caller`` and refuse without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

CALLER_KEYS = ("agent_id", "task_id", "idempotency_key")
_MAX_VALUE_LENGTH = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """The agent and task a tool runs for, and the key that makes its write replay-safe."""

    agent_id: str
    task_id: str
    idempotency_key: str


def caller_from_meta(meta: Mapping[str, Any] | None) -> Caller | None:
    """The caller named by a request ``_meta``, or None when any key is missing or malformed."""
    if not meta:
        return None
    agent_id, task_id, idempotency_key = (meta.get(key) for key in CALLER_KEYS)
    if not (_well_formed(agent_id) and _well_formed(task_id) and _well_formed(idempotency_key)):
        return None
    return Caller(agent_id=agent_id, task_id=task_id, idempotency_key=idempotency_key)


def optional_caller(ctx: Context[Any, Any]) -> Caller | None:
    """For read tools: the caller if the request named one."""
    return caller_from_meta(ctx.request_context.meta)


def require_caller(ctx: Context[Any, Any], tool: str) -> Caller:
    """For write tools: the caller, or a ToolError the model can read."""
    caller = optional_caller(ctx)
    if caller is None:
        raise ToolError(
            f"refused: {tool} writes on behalf of an agent, and this call did not say which "
            "(the worker sets agent_id, task_id and idempotency_key in the request _meta; "
            "they are not tool arguments)"
        )
    return caller


def _well_formed(value: object) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_VALUE_LENGTH
        and value.isprintable()
        and value.strip() == value
    )
