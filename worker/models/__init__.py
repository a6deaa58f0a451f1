"""The model layer: a small Model protocol, providers behind it, and a scripted model.

The providers load their SDKs (seconds of imports) only when first used, so
that commands like ``agent-worker cancel`` never pay for them; the worker
parent imports them once before it forks. ``FleetLimiter`` shares the providers'
rate limits across the fleet through Redis. ``UntrustedBlocks`` delimits what others
wrote (threads, feeds, tool results) so the model reads it as data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr
from worker.models._boundary import ModelBoundary
from worker.models._cache import PromptCache, agent_cache_key
from worker.models._scripted import ScriptedModel, Turn
from worker.models._text_calls import calls_in_text, with_text_calls
from worker.models._types import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ModelWrapper,
    StopReason,
    ToolCall,
    ToolSpec,
    Usage,
    joined_system,
)
from worker.models._untrusted import UNTRUSTED_TAG, UntrustedBlocks

if TYPE_CHECKING:
    from worker.models._anthropic import AnthropicModel
    from worker.models._factory import (
        PROVIDERS,
        aclose_shared_http_clients,
        create_model,
        load_price_table,
        provider_credentials,
    )
    from worker.models._fallback import FallbackModel
    from worker.models._limiter import FleetLimiter, RateLimitedModel, RateLimits
    from worker.models._openai import OpenAIModel
    from worker.models._prices import ModelPrice, PriceTable
    from worker.models._retry import AttemptGate, RetryingModel, RetryPolicy
    from worker.models._structured import (
        generate,
        parse_structured,
        parse_structured_text,
        strict_json_schema,
    )
    from worker.models._warmup import warm_up_providers

_LAZY = {
    "AnthropicModel": "worker.models._anthropic",
    "FallbackModel": "worker.models._fallback",
    "FleetLimiter": "worker.models._limiter",
    "RateLimitedModel": "worker.models._limiter",
    "RateLimits": "worker.models._limiter",
    "ModelPrice": "worker.models._prices",
    "PROVIDERS": "worker.models._factory",
    "OpenAIModel": "worker.models._openai",
    "PriceTable": "worker.models._prices",
    "AttemptGate": "worker.models._retry",
    "RetryPolicy": "worker.models._retry",
    "RetryingModel": "worker.models._retry",
    "aclose_shared_http_clients": "worker.models._factory",
    "create_model": "worker.models._factory",
    "generate": "worker.models._structured",
    "load_price_table": "worker.models._factory",
    "parse_structured": "worker.models._structured",
    "parse_structured_text": "worker.models._structured",
    "provider_credentials": "worker.models._factory",
    "strict_json_schema": "worker.models._structured",
    "warm_up_providers": "worker.models._warmup",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "PROVIDERS",
    "UNTRUSTED_TAG",
    "AnthropicModel",
    "AttemptGate",
    "FallbackModel",
    "FleetLimiter",
    "Message",
    "Model",
    "ModelBoundary",
    "ModelPrice",
    "ModelRequest",
    "ModelResponse",
    "ModelWrapper",
    "OpenAIModel",
    "PriceTable",
    "PromptCache",
    "RateLimitedModel",
    "RateLimits",
    "RetryPolicy",
    "RetryingModel",
    "ScriptedModel",
    "StopReason",
    "ToolCall",
    "ToolSpec",
    "Turn",
    "UntrustedBlocks",
    "Usage",
    "aclose_shared_http_clients",
    "agent_cache_key",
    "calls_in_text",
    "create_model",
    "generate",
    "joined_system",
    "load_price_table",
    "parse_structured",
    "parse_structured_text",
    "provider_credentials",
    "strict_json_schema",
    "warm_up_providers",
    "with_text_calls",
]
