"""What the gateway reads once at start, besides its environment block: the secrets and the
task's capability.

The secrets come one way per transport (stdin over the socket, where the worker writes
them; the secrets file over stdio, by hand); the capability is read from them once and
checked against the agent and task the environment block names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from worker.executors import CAPABILITY, GatewaySpec, read_secrets

# Capabilities (PyJWT, cryptography) load only when the task has one.
if TYPE_CHECKING:
    from worker.tools import Capability


def gateway_secrets(over_socket: bool, secrets_file: Path | None) -> dict[str, str]:
    """The secrets, read one way from where the transport leaves room for them: stdin over
    the socket (the worker writes them there), the secrets file over stdio (by hand)."""
    if over_socket:
        return read_secrets(sys.stdin)
    if secrets_file is None:
        return {}
    with secrets_file.open(encoding="utf-8") as file:
        return read_secrets(file)


@dataclass(frozen=True, slots=True)
class TaskCapability:
    """The task's capability as the secrets carried it, and its claims, read once."""

    token: str
    claims: Capability


def task_capability(spec: GatewaySpec, secrets: dict[str, str]) -> TaskCapability | None:
    """The capability from the secrets, checked against the spec; ValueError says why the
    gateway must not start (missing when required, expired, or for another task)."""
    token = secrets.get(CAPABILITY)
    if token is None:
        if spec.require_capability:
            raise ValueError(f"{CAPABILITY} is missing from the gateway's secrets")
        return None
    from worker.tools import CapabilityRefused, read_capability

    try:
        claims = read_capability(token)
    except CapabilityRefused as refusal:
        raise ValueError(f"{CAPABILITY}: {refusal}") from None
    if (claims.agent_id, claims.task_id) != (spec.agent_id, spec.task_id):
        raise ValueError(f"{CAPABILITY} is for another agent or task than GATEWAY_AGENT_ID/TASK_ID")
    return TaskCapability(token, claims)
