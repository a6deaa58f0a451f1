"""Grants: which tools an agent may call, capped by the operator's policy.

A grant is ``svc:scope`` or ``svc:scope:res`` (``hub:read``, ``github:write:org/repo``).
Tools *require* concrete grants (see ``worker.tools._config``); agents and the
policy hold *patterns*, which may end in ``*``:

- ``svc:*`` covers every grant of the service: ``svc:read``, ``svc:write:x``.
- ``svc:scope`` covers itself and every resource under it: ``svc:scope:res``.
- ``svc:scope:*`` covers every resource under the scope, not the bare scope.
- a bare ``*`` is rejected: a grant must name its service.

The operator's ``GRANT_POLICY`` YAML caps what agent definitions may claim::

    default: {allowed_grants: ["hub:*"], denied_grants: ["hub:admin"]}
    agents:
      devops-agent: {allowed_grants: ["hub:*", "github:read"]}

An agent entry replaces the default key by key (above, devops-agent keeps the
default ``denied_grants``). A missing ``allowed_grants`` allows whatever is
requested; an empty list allows nothing. Effective grants are
requested ∩ allowed minus denied, and denied wins:

- requested ``hub:*`` with allowed ``hub:read`` gives ``hub:read``
  (the intersection is the narrower pattern);
- requested ``hub:*`` with denied ``hub:write`` still covers ``hub:read``, but
  neither ``hub:write`` nor ``hub:write:anything``.

Because a denial can carve a hole in a wildcard, effective grants are an
``EffectiveGrants`` (allowed patterns, denied patterns) asked with ``covers``.
Without a policy file the requested grants are effective as they are.

The policy also caps the scope opt-ins a definition may set (docs/task-scope.md), by the
same key-by-key rule: ``allow_comment_on_any_post: false`` forbids
``scope.comment_on_any_post``, ``allowed_post_in: [m/announcements]`` lets ``scope.post_in``
name only those communities (``"*"``: any; ``[]``: none); a missing key caps nothing. A
definition that sets more is refused when it is loaded, not narrowed: its author asked
for a wider scope on purpose and must be told.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.exceptions import AgentConfigError, ConfigurationError

# In ``scope.post_in`` (a definition's) and ``allowed_post_in`` (the policy's): any community.
ANY_COMMUNITY = "*"

_SEGMENT = r"[a-z0-9][a-z0-9_.-]*"
_RESOURCE = r"[A-Za-z0-9_.@/-]+"
_REQUIRED_GRANT = re.compile(rf"^{_SEGMENT}:{_SEGMENT}(:{_RESOURCE})?$")
_GRANT_PATTERN = re.compile(rf"^{_SEGMENT}:(\*|{_SEGMENT}(:(\*|{_RESOURCE}))?)$")


def check_required_grant(grant: str) -> str:
    """Return ``grant`` if it is a concrete ``svc:scope[:res]``; raise ValueError otherwise."""
    if not isinstance(grant, str) or not _REQUIRED_GRANT.match(grant):
        raise ValueError(f"grant must look like svc:scope[:res], got {grant!r}")
    return grant


def check_grant_pattern(pattern: str) -> str:
    """Return ``pattern`` if it is a grant an agent or the policy may hold; raise ValueError."""
    if not isinstance(pattern, str) or not _GRANT_PATTERN.match(pattern):
        raise ValueError(
            f"grant must look like svc:scope[:res], svc:* or svc:scope:*, got {pattern!r}"
        )
    return pattern


def grant_covers(held: str, required: str) -> bool:
    """Whether holding the pattern ``held`` entitles a call that requires ``required``.

    ``required`` may itself be a pattern: then the answer is whether everything
    it covers is covered by ``held``.
    """
    held_parts = held.split(":")
    required_parts = required.split(":")
    if len(required_parts) < len(held_parts):
        return False
    *prefix, last = held_parts
    if prefix != required_parts[: len(prefix)]:
        return False
    return last == "*" or last == required_parts[len(prefix)]


def _intersection(first: str, second: str) -> str | None:
    """The pattern covering exactly what both patterns cover, or None when they are disjoint.

    Grant patterns are prefixes of one another or disjoint, so the
    intersection is the narrower of the two.
    """
    if grant_covers(first, second):
        return second
    if grant_covers(second, first):
        return first
    return None


@dataclass(frozen=True, slots=True)
class EffectiveGrants:
    """What one agent may call: any ``allowed`` pattern covers it and no ``denied`` one does.

    ``strict`` (STRICT_GRANTS, or the definition's ``behavior.strict_grants``): a call
    outside them ends the task as an autonomy violation instead of being refused.
    """

    allowed: frozenset[str]
    denied: frozenset[str] = field(default_factory=frozenset)
    strict: bool = False

    @classmethod
    def of(cls, grants: Iterable[str], *, strict: bool = False) -> EffectiveGrants:
        """Grants taken as they are (no policy); each must be a valid pattern."""
        return cls(allowed=frozenset(check_grant_pattern(grant) for grant in grants), strict=strict)

    def covers(self, required: str) -> bool:
        if any(grant_covers(denied, required) for denied in self.denied):
            return False
        return any(grant_covers(allowed, required) for allowed in self.allowed)

    def __str__(self) -> str:
        allowed = ", ".join(sorted(self.allowed)) or "nothing"
        if not self.denied:
            return allowed
        return f"{allowed} (except {', '.join(sorted(self.denied))})"


class _GrantRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # None: this entry says nothing about the key (the default's value, or no cap, applies).
    allowed_grants: tuple[str, ...] | None = None
    denied_grants: tuple[str, ...] | None = None
    allow_comment_on_any_post: bool | None = None
    allowed_post_in: tuple[str, ...] | None = None

    @field_validator("allowed_grants", "denied_grants")
    @classmethod
    def _patterns(cls, patterns: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if patterns is not None:
            for pattern in patterns:
                check_grant_pattern(pattern)
        return patterns


class GrantPolicy(BaseModel):
    """The operator's cap on agent grants. ``GrantPolicy()`` (no file) caps nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: _GrantRule = Field(default_factory=_GrantRule)
    agents: Mapping[str, _GrantRule] = Field(default_factory=dict)

    def effective_grants(self, agent: str, requested: Sequence[str]) -> EffectiveGrants:
        """Requested ∩ allowed minus denied for ``agent``; AgentConfigError on a bad request."""
        try:
            requested_patterns = [check_grant_pattern(grant) for grant in requested]
        except ValueError as exc:
            raise AgentConfigError(f"agent {agent!r}: grants: {exc}") from exc
        rule = self._rule(agent)
        allowed, denied = rule.allowed_grants, rule.denied_grants
        if allowed is None:
            kept = set(requested_patterns)
        else:
            kept = {
                narrower
                for wanted in requested_patterns
                for permitted in allowed
                if (narrower := _intersection(wanted, permitted)) is not None
            }
        return EffectiveGrants(allowed=frozenset(kept), denied=frozenset(denied or ()))

    def refused_opt_ins(
        self, agent: str, *, comment_on_any_post: bool, post_in: Sequence[str]
    ) -> list[str]:
        """The scope opt-ins of ``agent``'s definition this policy does not allow, named as
        in config.yaml (``scope.post_in m/x``); [] when it allows them all."""
        rule = self._rule(agent)
        communities = rule.allowed_post_in
        refused = []
        if comment_on_any_post and rule.allow_comment_on_any_post is False:
            refused.append("scope.comment_on_any_post")
        if communities is not None and ANY_COMMUNITY not in communities:
            refused += [
                f"scope.post_in {community}"
                for community in post_in
                if community not in communities
            ]
        return refused

    def _rule(self, agent: str) -> _GrantRule:
        """``agent``'s entry over the default, key by key."""
        own = self.agents.get(agent)
        if own is None:
            return self.default
        return self.default.model_copy(update=own.model_dump(exclude_none=True))


def load_grant_policy(path: Path | None) -> GrantPolicy:
    """Read ``GRANT_POLICY``; None gives the empty policy (requested grants are effective)."""
    if path is None:
        return GrantPolicy()
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: cannot read the grant policy: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: expected a mapping with 'default' and 'agents'")
    try:
        return GrantPolicy.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(f"{path}: {describe_validation_error(exc)}") from exc


@functools.lru_cache(maxsize=4)
def cached_grant_policy(path: Path | None) -> GrantPolicy:
    """``load_grant_policy``, read once per process (the operator's file is read at start)."""
    return load_grant_policy(path)


def describe_validation_error(exc: ValidationError, prefix: Sequence[str | int] = ()) -> str:
    """One line per problem, ``dotted.location: message``, without the input values."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        location = ".".join(str(part) for part in (*prefix, *error["loc"]))
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{location}: {message}" if location else message)
    return "; ".join(lines)
