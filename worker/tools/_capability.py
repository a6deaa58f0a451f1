"""The per-task capability: which agent calls our MCP servers, for which task, with
which grants, until when.

The worker mints one per task with ``CAPABILITY_KEY`` (``mint_capability``) and
sends it as ``_meta.capability`` with every call to a first-party server. Our
servers verify it with the same key (``verify_capability``), take the agent and
task from it (never from the rest of ``_meta``, which any bearer can write), and
check each tool's grant against it. A stolen ``MCP_AUTH_TOKEN`` alone therefore
acts for nobody, and a capability minted for agent A never acts as B.

The format is a JWT signed with HS256 (PyJWT): ``sub`` the agent id, ``tid`` the
task id, ``grants`` and ``denied`` the effective grant patterns, ``iat``, ``exp``
the task's deadline, audience ``hub-agent-worker-mcp``, and ``scope``: where this task
may write (``worker.tools._scope.TaskScope.to_claim``). A capability without ``scope``
(signed by a worker from before scopes) is bounded by its grants alone, as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jwt

from worker.settings import MIN_KEY_LENGTH, key_too_short
from worker.tools._grants import EffectiveGrants
from worker.tools._scope import TaskScope

AUDIENCE = "hub-agent-worker-mcp"
ALGORITHM = "HS256"
# Clocks of worker hosts and server hosts differ a little.
CLOCK_LEEWAY_S = 5.0
_REQUIRED_CLAIMS = ("sub", "tid", "grants", "denied", "exp", "iat", "aud")


class CapabilityRefused(ValueError):
    """The capability is missing, malformed, tampered with, expired or for something else."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capability:
    """What a verified capability says: the caller and the grants it may use until when."""

    agent_id: str
    task_id: str
    grants: tuple[str, ...]
    denied: tuple[str, ...]
    expires_at: float
    # Where the task may write; None: a capability from before scopes (grants alone).
    scope: TaskScope | None = None

    def effective_grants(self) -> EffectiveGrants:
        return EffectiveGrants(allowed=frozenset(self.grants), denied=frozenset(self.denied))

    def allows(self, required_grant: str) -> bool:
        return self.effective_grants().covers(required_grant)

    def remaining_s(self, now: float | None = None) -> float:
        return self.expires_at - (time.time() if now is None else now)


def check_key(key: str, *, variable: str = "CAPABILITY_KEY") -> str:
    """Return ``key``; raise ValueError naming ``variable`` when it is too short to sign with."""
    if len(key) < MIN_KEY_LENGTH:
        raise ValueError(f"{variable} {key_too_short(len(key))}")
    return key


def mint_capability(
    key: str,
    *,
    agent_id: str,
    task_id: str,
    grants: EffectiveGrants,
    expires_at: float,
    scope: TaskScope,
    now: float | None = None,
) -> str:
    """A signed capability for one task, valid until ``expires_at`` (epoch seconds), for
    writes within ``scope``."""
    claims: dict[str, Any] = {
        "sub": agent_id,
        "tid": task_id,
        "grants": sorted(grants.allowed),
        "denied": sorted(grants.denied),
        "iat": int(time.time() if now is None else now),
        "exp": int(expires_at) + 1,  # whole seconds, never shorter than asked
        "aud": AUDIENCE,
        "scope": scope.to_claim(),
    }
    return jwt.encode(claims, check_key(key), algorithm=ALGORITHM)


def verify_capability(key: str, token: object) -> Capability:
    """The capability ``token`` carries, if ``key`` signed it and it has not expired."""
    if not isinstance(token, str) or not token:
        raise CapabilityRefused("no capability in the request _meta")
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            audience=AUDIENCE,
            leeway=CLOCK_LEEWAY_S,
            options={"require": list(_REQUIRED_CLAIMS)},
        )
    except jwt.ExpiredSignatureError:
        raise CapabilityRefused("the capability has expired (the task's deadline passed)") from None
    except jwt.InvalidSignatureError:
        raise CapabilityRefused("the capability's signature does not verify") from None
    except jwt.PyJWTError as exc:
        raise CapabilityRefused(f"the capability is not valid: {exc}") from None
    return _capability(claims)


def read_capability(token: str) -> Capability:
    """What ``token`` claims, without its signature checked (its expiry is checked).

    For a holder that only forwards the capability, as the gateway does: it has no key
    (the CLI beside it could read one), so the servers it forwards to verify the signature.
    """
    try:
        claims = jwt.decode(
            token,
            algorithms=[ALGORITHM],
            audience=AUDIENCE,
            leeway=CLOCK_LEEWAY_S,
            # Without the signature PyJWT skips every other check unless asked for it.
            options={
                "verify_signature": False,
                "verify_exp": True,
                "verify_aud": True,
                "require": list(_REQUIRED_CLAIMS),
            },
        )
    except jwt.ExpiredSignatureError:
        raise CapabilityRefused("the capability has expired (the task's deadline passed)") from None
    except jwt.PyJWTError as exc:
        raise CapabilityRefused(f"the capability is not valid: {exc}") from None
    return _capability(claims)


def _capability(claims: dict[str, Any]) -> Capability:
    scope = None
    if "scope" in claims:
        try:
            scope = TaskScope.from_claim(claims["scope"])
        except ValueError as exc:
            raise CapabilityRefused(f"the capability's 'scope' claim is not valid: {exc}") from None
    return Capability(
        agent_id=_text(claims, "sub"),
        task_id=_text(claims, "tid"),
        grants=_texts(claims, "grants"),
        denied=_texts(claims, "denied"),
        expires_at=float(claims["exp"]),
        scope=scope,
    )


def _text(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise CapabilityRefused(f"the capability's {name!r} claim is not a string")
    return value


def _texts(claims: dict[str, Any], name: str) -> tuple[str, ...]:
    values = claims.get(name)
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise CapabilityRefused(f"the capability's {name!r} claim is not a list of strings")
    return tuple(values)
