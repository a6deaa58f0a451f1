"""What the operator lets an agent definition choose, checked when the definition is loaded.

A definition is written by whoever controls ``AGENTS_DIR``; the worker's keys belong
to the operator. So a definition may point ``brain.api_base`` only at an endpoint the
operator listed (``PROVIDER_BASE_URLS``, or the operator's own ``*_BASE_URL``), and may
name in ``brain.api_key_env`` only a variable the operator listed (``AGENT_KEY_ENVS``).

The default case of the public format is the exception: a definition naming its provider's
public endpoint (or the operator's ``*_BASE_URL``) together with that provider's key variable
(``OPENAI_API_KEY`` for openai) asks for the operator's own endpoint and key, and gets them:
the model is then called exactly as with no ``api_base`` and no ``api_key_env``, so the
operator's ``*_BASE_URL`` stands in for the public endpoint.

The worker's own provider key goes only to the operator's endpoint for it: that rule is
enforced where keys meet endpoints (``worker.models._factory``); this check makes a
definition that would break it fail at load, with the file and field named.

``GRANT_POLICY`` caps the scope opt-ins (``scope.comment_on_any_post``, ``scope.post_in``)
as it caps grants: a definition that widens its tasks' scope beyond it fails at load too,
naming the opt-in, the agent and the policy's file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field

from worker._network import (
    SDK_DEFAULT_BASE_URLS,
    normalise_base_url,
    operator_endpoint,
    same_endpoint,
    worker_secret_variables,
)
from worker.agents._config import AgentConfig, Brain
from worker.exceptions import AgentConfigError, ConfigurationError
from worker.settings import Settings
from worker.tools import GrantPolicy, cached_grant_policy

# The worker's key variable and base URL variable for each provider.
PROVIDER_VARIABLES = {
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
}


def _settings_secret_variables() -> frozenset[str]:
    return _secret_variables_of(Settings)


@functools.cache
def _secret_variables_of(settings_type: type[Settings]) -> frozenset[str]:
    # A class's fields never change: derived once per class, not on every task's policy.
    return worker_secret_variables(settings_type.model_fields)


@dataclass(frozen=True, slots=True, kw_only=True)
class DefinitionPolicy:
    """The operator's rules for definitions. The default allows no endpoint and no key
    variable of the definition's choosing, and tolerates unknown keys."""

    # Normalised base URLs a definition may name as brain.api_base.
    provider_base_urls: frozenset[str] = frozenset()
    # Variables a definition may name as brain.api_key_env.
    agent_key_envs: frozenset[str] = frozenset()
    # The operator's *_BASE_URL per provider (None: the SDK's default endpoint).
    operator_endpoints: dict[str, str | None] = field(default_factory=dict)
    # Variables holding the worker's own secrets, to say so when a definition names one.
    worker_secret_envs: frozenset[str] = field(default_factory=_settings_secret_variables)
    # AGENTS_STRICT: an unknown key is an error instead of a warning.
    strict: bool = False
    # GRANT_POLICY's caps on the scope opt-ins, and its file (named when it refuses one).
    grant_policy: GrantPolicy = field(default_factory=GrantPolicy)
    grant_policy_file: str = "GRANT_POLICY (none)"

    @classmethod
    def from_settings(cls, settings: Settings) -> DefinitionPolicy:
        operator_endpoints = {
            "anthropic": settings.anthropic_base_url,
            "openai": settings.openai_base_url,
        }
        return cls(
            provider_base_urls=frozenset(settings.provider_base_urls),
            agent_key_envs=frozenset(settings.agent_key_envs),
            operator_endpoints=operator_endpoints,
            worker_secret_envs=_secret_variables_of(type(settings)),
            strict=settings.agents_strict,
            grant_policy=cached_grant_policy(settings.grant_policy),
            grant_policy_file=f"GRANT_POLICY ({settings.grant_policy})",
        )

    def check(self, config: AgentConfig, file: str) -> None:
        """Raise AgentConfigError naming ``file`` and the field a definition may not set."""
        self.check_brain(config.brain, file)
        refused = self.grant_policy.refused_opt_ins(
            config.name,
            comment_on_any_post=config.scope.comment_on_any_post,
            post_in=config.scope.post_in,
        )
        if refused:
            raise AgentConfigError(
                f"{file}: {', '.join(refused)}: not allowed for agent {config.name!r} "
                f"by {self.grant_policy_file}"
            )

    def check_brain(self, brain: Brain, file: str) -> None:
        if self.uses_operator_access(brain):
            return
        if brain.api_key_env is not None:
            self._check_key_variable(brain, brain.api_key_env, file)
        if brain.api_base is not None:
            self._check_api_base(brain, brain.api_base, file)

    def uses_operator_access(self, brain: Brain) -> bool:
        """Whether the model is called with the operator's own endpoint and key: the
        definition names no key or its provider's key variable, and no endpoint, its
        provider's public one or the operator's ``*_BASE_URL``."""
        key_variable, _ = PROVIDER_VARIABLES[brain.provider]
        if brain.api_key_env not in (None, key_variable):
            return False
        return brain.api_base is None or self._names_operator_endpoint(brain, brain.api_base)

    def model_access(self, brain: Brain, file: str) -> tuple[str | None, str | None]:
        """The ``(api_key, base_url)`` a model of ``brain`` is built with, after ``check_brain``:
        ``(None, None)`` for the operator's own endpoint and key, else the definition's
        endpoint and the value of its key variable. Raises ConfigurationError when that
        variable is not set."""
        self.check_brain(brain, file)
        if self.uses_operator_access(brain):
            return None, None
        api_key: str | None = None
        if brain.api_key_env:
            api_key = os.environ.get(brain.api_key_env)
            if not api_key:
                raise ConfigurationError(
                    f"{brain.api_key_env} is not set ({file}: brain.api_key_env names it)"
                )
        return api_key, brain.api_base

    def fingerprint(self) -> str:
        """Tells cache entries checked under other rules apart (another host's settings)."""
        rules = {
            "urls": sorted(self.provider_base_urls),
            "keys": sorted(self.agent_key_envs),
            "own": sorted((k, v or "") for k, v in self.operator_endpoints.items()),
            "strict": self.strict,
            "grant_policy": self.grant_policy.model_dump(mode="json"),
        }
        return hashlib.sha256(json.dumps(rules).encode()).hexdigest()[:16]

    def _check_key_variable(self, brain: Brain, name: str, file: str) -> None:
        key_variable, base_variable = PROVIDER_VARIABLES[brain.provider]
        if name == key_variable:
            # Reached only with an endpoint that is not the operator's (uses_operator_access).
            raise AgentConfigError(
                f"{file}: brain.api_key_env: {name} is the worker's own secret, sent only to "
                f"{base_variable} or the provider's public endpoint, not to {brain.api_base!r}"
            )
        if name.upper() in self.worker_secret_envs:
            raise AgentConfigError(
                f"{file}: brain.api_key_env: {name} is the worker's own secret; "
                "a definition may name only AGENT_KEY_ENVS variables"
            )
        if name not in self.agent_key_envs:
            raise AgentConfigError(f"{file}: brain.api_key_env {name!r} is not in AGENT_KEY_ENVS")

    def _names_operator_endpoint(self, brain: Brain, api_base: str) -> bool:
        """The operator's endpoint for the provider, or the provider's public one (which the
        operator's ``*_BASE_URL``, when set, stands in for)."""
        own_endpoint = operator_endpoint(
            brain.provider, self.operator_endpoints.get(brain.provider)
        )
        return same_endpoint(api_base, own_endpoint) or same_endpoint(
            api_base, SDK_DEFAULT_BASE_URLS[brain.provider]
        )

    def _check_api_base(self, brain: Brain, api_base: str, file: str) -> None:
        try:
            endpoint = normalise_base_url(api_base)
        except ValueError as exc:
            raise AgentConfigError(f"{file}: brain.api_base: {exc}") from None
        own_endpoint = operator_endpoint(
            brain.provider, self.operator_endpoints.get(brain.provider)
        )
        if same_endpoint(endpoint, own_endpoint):
            return  # the operator's own endpoint for this provider: the agent's key may go there
        if endpoint not in self.provider_base_urls:
            raise AgentConfigError(
                f"{file}: brain.api_base {api_base!r} is not in PROVIDER_BASE_URLS"
            )
        if brain.api_key_env is None:
            key_variable, base_variable = PROVIDER_VARIABLES[brain.provider]
            raise AgentConfigError(
                f"{file}: brain.api_base {api_base!r} needs brain.api_key_env: the worker's "
                f"{key_variable} is sent only to {base_variable}"
            )
