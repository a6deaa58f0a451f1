"""Building models from an agent's brain settings and the process environment."""

from __future__ import annotations

import asyncio
import importlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx2
from pydantic import SecretStr

from worker._network import client_ssl_context, operator_endpoint, same_endpoint
from worker._process_loop import process_transport
from worker.exceptions import AgentConfigError, ConfigurationError
from worker.models._cache import PromptCache
from worker.models._fallback import FallbackModel
from worker.models._prices import PriceTable
from worker.models._retry import RetryingModel, RetryPolicy
from worker.models._types import Model
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.models._anthropic import AnthropicModel
    from worker.models._limiter import FleetLimiter
    from worker.models._openai import OpenAIModel


@dataclass(frozen=True, slots=True)
class _Provider:
    """A provider, its SDK imported only when a model of it is built: importing the
    anthropic SDK alone costs a process start about a second of CPU."""

    module: str
    class_name: str
    sdk: str
    key_variable: str
    base_url_variable: str

    @property
    def model_class(self) -> type[AnthropicModel] | type[OpenAIModel]:
        model_class: type[AnthropicModel] | type[OpenAIModel] = getattr(
            importlib.import_module(self.module), self.class_name
        )
        return model_class

    def api_key(self, settings: Settings) -> SecretStr | None:
        key: SecretStr | None = getattr(settings, self.key_variable.lower())
        return key

    def base_url(self, settings: Settings) -> str | None:
        url: str | None = getattr(settings, self.base_url_variable.lower())
        return url


_PROVIDERS = {
    "anthropic": _Provider(
        "worker.models._anthropic",
        "AnthropicModel",
        "anthropic",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
    ),
    "openai": _Provider(
        "worker.models._openai", "OpenAIModel", "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL"
    ),
}
PROVIDERS = frozenset(_PROVIDERS)


def provider_model_class(provider: str) -> type[AnthropicModel] | type[OpenAIModel]:
    """The model class of a provider in ``PROVIDERS``, its SDK imported now."""
    return _PROVIDERS[provider].model_class


# One connection pool per provider and base URL, per event loop: pooled connections
# belong to the loop that opened them. Dead loops drop out with their clients.
_shared_http_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, str], httpx2.AsyncClient]
] = weakref.WeakKeyDictionary()


def create_model(
    provider: str,
    model: str,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    temperature: float | None = None,
    max_output_tokens: int = 4096,
    fallbacks: Sequence[tuple[str, str]] = (),
    settings: Settings,
    prices: PriceTable,
    rate_limiter: FleetLimiter | None = None,
    prompt_cache: PromptCache | None = None,
) -> Model:
    """The model an agent asked for, wrapped in a FallbackModel when it names fallbacks.

    Keys and base URLs come from the environment (``settings``) unless given;
    an explicit key and base URL also serve fallbacks on the same provider. The worker's
    own key is used only with the operator's endpoint: a ``base_url`` elsewhere needs
    its own ``api_key``. With ``rate_limiter``, every single request of each model in
    the chain (retries included) takes from that model's fleet-wide buckets, and a
    provider's ``Retry-After`` holds the whole fleet. ``prompt_cache`` None: no model of
    the chain asks its provider's prompt cache for anything.
    """
    chain: list[RetryingModel] = []
    for provider_name, model_name in [(provider, model), *fallbacks]:
        same_provider = provider_name.strip().lower() == provider.strip().lower()
        chain.append(
            _provider_model(
                provider_name,
                model_name,
                api_key=api_key if same_provider else None,
                base_url=base_url if same_provider else None,
                temperature=temperature,
                max_output_tokens=max_output_tokens,
                settings=settings,
                prices=prices,
                prompt_cache=prompt_cache,
            )
        )
    if rate_limiter is not None:
        for member in chain:
            # Gated per attempt, not per call: a retry storm is when the fleet must slow down.
            member.attempt_gate = rate_limiter.for_model(member.provider, member.name)
    return chain[0] if len(chain) == 1 else FallbackModel(chain)


def load_price_table(settings: Settings) -> PriceTable:
    """The built-in prices, with ``PRICES_FILE`` merged over them when set."""
    if settings.prices_file is None:
        return PriceTable.builtin()
    return PriceTable.from_yaml(settings.prices_file)


def shared_http_client(
    provider: str, base_url: str | None, concurrency: int = 1
) -> httpx2.AsyncClient | None:
    """This event loop's client for a provider endpoint, over the process's pooled
    connections to it (``worker._process_loop``; in a job process, this loop's own); None
    outside a running loop (the SDK then keeps its own client for the model)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    clients = _shared_http_clients.setdefault(loop, {})
    key = (provider, base_url or "")
    client = clients.get(key)
    if client is None or client.is_closed:
        sdk_default = importlib.import_module(_PROVIDERS[provider].sdk).DefaultAsyncHttpxClient
        # The process's shared TLS context: building one per client costs tens of ms.
        transport = process_transport(
            f"{provider} {base_url or ''}",
            lambda limits: httpx2.AsyncHTTPTransport(verify=client_ssl_context(), limits=limits),
            concurrency=concurrency,
        )
        if transport is None:
            client = sdk_default(verify=client_ssl_context())
        else:
            client = sdk_default(transport=transport)
        clients[key] = client
    return client


async def aclose_shared_http_clients() -> None:
    """Close this event loop's pooled clients; call before the loop ends (job teardown)."""
    loop = asyncio.get_running_loop()
    clients = _shared_http_clients.pop(loop, {})
    for client in clients.values():
        await client.aclose()


def _provider_model(
    provider: str,
    model: str,
    *,
    api_key: str | None,
    base_url: str | None,
    temperature: float | None,
    max_output_tokens: int,
    settings: Settings,
    prices: PriceTable,
    prompt_cache: PromptCache | None,
) -> RetryingModel:
    key, endpoint = provider_credentials(
        provider, model, api_key=api_key, base_url=base_url, settings=settings
    )
    provider_name = provider.strip().lower()
    return _PROVIDERS[provider_name].model_class(
        model,
        api_key=key,
        base_url=endpoint,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        default_timeout_s=settings.llm_timeout_s,
        retry=RetryPolicy(max_retries=settings.llm_max_retries),
        prices=prices,
        http_client=shared_http_client(provider_name, endpoint, settings.worker_concurrency),
        prompt_cache=prompt_cache,
    )


def provider_credentials(
    provider: str,
    model: str,
    *,
    api_key: str | None,
    base_url: str | None,
    settings: Settings,
) -> tuple[str, str | None]:
    """The key and endpoint a model is called with (the CLI executors need them too):
    ``api_key``/``base_url`` from the definition, else the operator's. Raises
    AgentConfigError otherwise.

    The worker's own key is looked up by endpoint: it exists only for the operator's
    endpoint of its provider (``*_BASE_URL``, else the SDK's default), so no base URL
    from anywhere else can ever receive it.
    """
    provider_name = provider.strip().lower()
    spec = _PROVIDERS.get(provider_name)
    if spec is None:
        raise AgentConfigError(
            f"unknown model provider {provider!r} for model {model!r} "
            f"(known: {', '.join(sorted(_PROVIDERS))}; OpenAI-compatible servers use 'openai' "
            "with OPENAI_BASE_URL)"
        )
    own_endpoint = spec.base_url(settings)
    is_own_endpoint = base_url is None or same_endpoint(
        base_url, operator_endpoint(provider_name, own_endpoint)
    )
    worker_key = _secret_value(spec.api_key(settings)) if is_own_endpoint else None
    key = api_key or worker_key
    if not key:
        if is_own_endpoint:
            raise ConfigurationError(
                f"{spec.key_variable} is not set; {provider_name} model {model!r} needs it"
            )
        raise AgentConfigError(
            f"{provider_name} model {model!r} at {base_url!r} has no key of its own: the "
            f"worker's {spec.key_variable} is sent only to {spec.base_url_variable}"
        )
    if api_key is not None and api_key != worker_key and api_key in _worker_secrets(settings):
        # An agent key variable that holds a copy of one of the worker's secrets.
        raise AgentConfigError(
            f"the key given for {provider_name} model {model!r} is one of the worker's own secrets"
        )
    return key, (own_endpoint if is_own_endpoint else base_url)


def _worker_secrets(settings: Settings) -> set[str]:
    return {*settings.secret_values(), settings.redis_url}


def _secret_value(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None
