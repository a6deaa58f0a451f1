"""Who is calling a tool, and whether they may: from the request ``_meta`` the worker sets.

The worker calls ``ClientSession.call_tool(name, arguments, meta={...})`` with
``agent_id``, ``task_id``, ``idempotency_key``, ``deadline`` (epoch seconds) and,
for our servers, ``capability``: a token signed with ``CAPABILITY_KEY`` (see
``worker.tools._capability``). These are not tool parameters, so the model can
neither see nor choose them.

With ``CAPABILITY_KEY`` set (production), every call needs a valid, unexpired
capability: the agent and task come from it, never from the rest of ``_meta``
(which anyone holding ``MCP_AUTH_TOKEN`` could write), the tool's grant must be
among its grants, the idempotency key must belong to its task, and the work is
bounded by its expiry (the task's deadline). The capability's ``scope`` says where
the task may write (``worker.tools._scope``): a server's write tools check it before they
act. Without a key (development), the caller is read from ``_meta`` as given, with no
scope, and the server warns at start.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from worker.tools import CapabilityRefused, TaskScope, check_key, verify_capability

CAPABILITY_KEY_ENV = "CAPABILITY_KEY"
CALLER_KEYS = ("agent_id", "task_id", "idempotency_key")
_MAX_VALUE_LENGTH = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """The agent and task a tool runs for, the key that makes its write replay-safe, and
    when its work must be done (epoch seconds; None: the server's own timeouts only)."""

    agent_id: str
    task_id: str
    idempotency_key: str | None
    deadline: float | None = None
    # Where the task may write, from its verified capability; None: grants alone bound it
    # (development mode, or a capability signed before scopes).
    scope: TaskScope | None = None

    def time_left(self, cap_s: float) -> float:
        """Seconds this call may still take: ``cap_s``, or less when the deadline is nearer."""
        if self.deadline is None:
            return cap_s
        left = self.deadline - time.time()
        if left <= 0:
            raise ToolError("refused: the task's deadline has passed")
        return min(cap_s, left)


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """How one server learns and checks its caller: ``tool_grants`` is the grant each of its
    tools requires; ``capability_key`` None means development mode (``_meta`` trusted)."""

    tool_grants: Mapping[str, str]
    capability_key: str | None = None

    def caller(self, ctx: Context[Any, Any], tool: str) -> Caller | None:
        """The verified caller (ToolError when a key is set and the call may not run);
        without a key, whoever ``_meta`` names, or None."""
        meta = ctx.request_context.meta or {}
        if self.capability_key is None:
            return caller_from_meta(meta)
        try:
            capability = verify_capability(self.capability_key, meta.get("capability"))
        except CapabilityRefused as refusal:
            raise ToolError(f"refused: {refusal}") from None
        required = self.tool_grants.get(tool)
        if required is None or not capability.allows(required):
            raise ToolError(
                f"refused: agent {capability.agent_id!r} does not hold {required or 'a grant'} "
                f"for {tool}"
            )
        key = meta.get("idempotency_key")
        # A key of another task would let a replay answer for someone else's write.
        if not (_well_formed(key) and key.startswith(f"{capability.task_id}:")):
            key = None
        return Caller(
            agent_id=capability.agent_id,
            task_id=capability.task_id,
            idempotency_key=key,
            deadline=min(capability.expires_at, _deadline(meta) or capability.expires_at),
            scope=capability.scope,
        )


def identity_from_env(env: Mapping[str, str], tool_grants: Mapping[str, str]) -> Identity:
    """The server's Identity; ValueError naming CAPABILITY_KEY when it is too short."""
    key = env.get(CAPABILITY_KEY_ENV) or None
    if key is not None:
        check_key(key, variable=CAPABILITY_KEY_ENV)
    return Identity(tool_grants=dict(tool_grants), capability_key=key)


def caller_from_meta(meta: Mapping[str, Any] | None) -> Caller | None:
    """The caller named by a request ``_meta``, or None when any key is missing or malformed.

    Trusts what it reads: only for servers without ``CAPABILITY_KEY`` (development).
    """
    if not meta:
        return None
    agent_id, task_id, idempotency_key = (meta.get(key) for key in CALLER_KEYS)
    if not (_well_formed(agent_id) and _well_formed(task_id) and _well_formed(idempotency_key)):
        return None
    return Caller(
        agent_id=agent_id,
        task_id=task_id,
        idempotency_key=idempotency_key,
        deadline=_deadline(meta),
    )


def _deadline(meta: Mapping[str, Any]) -> float | None:
    value = meta.get("deadline")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _well_formed(value: object) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_VALUE_LENGTH
        and value.isprintable()
        and value.strip() == value
    )
