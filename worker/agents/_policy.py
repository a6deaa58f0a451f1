"""What the operator lets an agent definition choose, checked when the definition is loaded.

A definition is written by whoever controls ``AGENTS_DIR``; the worker's keys belong
to the operator. So a definition may point ``brain.api_base`` only at an endpoint the
operator listed (``PROVIDER_BASE_URLS``, or the operator's own ``*_BASE_URL``), and may
name in ``brain.api_key_env`` only a variable the operator listed (``AGENT_KEY_ENVS``).
The worker's own provider key goes only to the operator's endpoint for it: that rule is
enforced where keys meet endpoints (``worker.models._factory``); this check makes a
definition that would break it fail at load, with the file and field named.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from worker._network import (
    normalise_base_url,
    operator_endpoint,
    same_endpoint,
    worker_secret_variables,
)
from worker.agents._config import AgentConfig, Brain
from worker.exceptions import AgentConfigError
from worker.settings import Settings

# The worker's key variable and base URL variable for each provider.
PROVIDER_VARIABLES = {
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
}


def _settings_secret_variables() -> frozenset[str]:
    return worker_secret_variables(Settings.model_fields)


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
            worker_secret_envs=worker_secret_variables(type(settings).model_fields),
            strict=settings.agents_strict,
        )

    def check(self, config: AgentConfig, file: str) -> None:
        """Raise AgentConfigError naming ``file`` and the field a definition may not set."""
        self.check_brain(config.brain, file)

    def check_brain(self, brain: Brain, file: str) -> None:
        if brain.api_key_env is not None:
            self._check_key_variable(brain.api_key_env, file)
        if brain.api_base is not None:
            self._check_api_base(brain, brain.api_base, file)

    def fingerprint(self) -> str:
        """Tells cache entries checked under other rules apart (another host's settings)."""
        rules = {
            "urls": sorted(self.provider_base_urls),
            "keys": sorted(self.agent_key_envs),
            "own": sorted((k, v or "") for k, v in self.operator_endpoints.items()),
            "strict": self.strict,
        }
        return hashlib.sha256(json.dumps(rules).encode()).hexdigest()[:16]

    def _check_key_variable(self, name: str, file: str) -> None:
        if name.upper() in self.worker_secret_envs:
            raise AgentConfigError(
                f"{file}: brain.api_key_env: {name} is the worker's own secret; "
                "a definition may name only AGENT_KEY_ENVS variables"
            )
        if name not in self.agent_key_envs:
            raise AgentConfigError(f"{file}: brain.api_key_env {name!r} is not in AGENT_KEY_ENVS")

    def _check_api_base(self, brain: Brain, api_base: str, file: str) -> None:
        try:
            endpoint = normalise_base_url(api_base)
        except ValueError as exc:
            raise AgentConfigError(f"{file}: brain.api_base: {exc}") from None
        own_endpoint = operator_endpoint(
            brain.provider, self.operator_endpoints.get(brain.provider)
        )
        if same_endpoint(endpoint, own_endpoint):
            return  # the operator's own endpoint for this provider: its key may go there
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
