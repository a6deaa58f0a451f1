"""The one LLM credential and endpoint a CLI gets, and the minimal environment around it.

Same rules as the native models (``worker.pipeline.make_model``), by the same function
(``worker.models.provider_credentials``): ``brain.api_key_env`` names the agent's own
key variable; a definition that picks its own ``api_base`` must also name its key, so
the worker's key never goes to an endpoint a definition chose; otherwise the worker's
``ANTHROPIC_*`` / ``OPENAI_*`` settings apply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from worker.agents import AgentDefinition, DefinitionPolicy
from worker.settings import Settings

# The whole environment of a CLI, besides its credential and its own switches.
_PASSED_THROUGH = ("PATH", "LANG")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderAccess:
    """``base_url`` follows the official SDKs: Anthropic without ``/v1``, OpenAI with it."""

    provider: str
    model: str
    api_key: str
    base_url: str | None

    def __repr__(self) -> str:
        return f"ProviderAccess(provider={self.provider!r}, model={self.model!r}, api_key=***)"

    @property
    def anthropic_base_url(self) -> str:
        return (self.base_url or "https://api.anthropic.com").rstrip("/")

    @property
    def openai_base_url(self) -> str:
        return (self.base_url or "https://api.openai.com/v1").rstrip("/")

    @property
    def endpoint(self) -> str:
        """The base URL the CLI calls, its provider's default included."""
        return self.anthropic_base_url if self.provider == "anthropic" else self.openai_base_url

    def through_relay(self, relay_url: str, placeholder_key: str) -> ProviderAccess:
        """The access a sandboxed CLI gets: the relay's URL and a key that opens nothing
        (the relay adds the real one, ``worker.executors._egress``)."""
        return replace(self, base_url=relay_url, api_key=placeholder_key)


def provider_access(agent: AgentDefinition, settings: Settings) -> ProviderAccess:
    """The key and endpoint the agent's CLI gets, chosen as for a native model
    (``worker.models.provider_credentials``): an agent key holding a copy of a worker
    secret is refused, and the worker's own key goes only to the operator's endpoint."""
    from worker.models import provider_credentials  # the factory imports the provider SDKs

    brain = agent.config.brain
    where = f"agents/{agent.config.name}/config.yaml"
    # A cached definition may predate the operator's rules: checked again, as native models are.
    api_key, base_url = DefinitionPolicy.from_settings(settings).model_access(brain, where)
    key, endpoint = provider_credentials(
        brain.provider, brain.model, api_key=api_key, base_url=base_url, settings=settings
    )
    return ProviderAccess(
        provider=brain.provider, model=brain.model, api_key=key, base_url=endpoint
    )


def minimal_environment(home: str) -> dict[str, str]:
    """PATH, locale and a HOME of the task's own: nothing of the worker's secrets or config."""
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = home
    return env
