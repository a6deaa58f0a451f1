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
from worker.models._boundary import ModelBoundary as ModelBoundary
from worker.models._cache import PromptCache as PromptCache
from worker.models._cache import agent_cache_key as agent_cache_key
from worker.models._text_calls import with_text_calls as with_text_calls
from worker.models._types import Message as Message
from worker.models._types import Model as Model
from worker.models._types import ModelRequest as ModelRequest
from worker.models._types import ModelResponse as ModelResponse
from worker.models._types import StopReason as StopReason
from worker.models._types import ToolCall as ToolCall
from worker.models._types import ToolSpec as ToolSpec
from worker.models._types import Usage as Usage
from worker.models._types import joined_system as joined_system
from worker.models._untrusted import UntrustedBlocks as UntrustedBlocks

if TYPE_CHECKING:
    from worker.models._factory import PROVIDERS as PROVIDERS
    from worker.models._factory import aclose_shared_http_clients as aclose_shared_http_clients
    from worker.models._factory import create_model as create_model
    from worker.models._factory import load_price_table as load_price_table
    from worker.models._factory import provider_credentials as provider_credentials
    from worker.models._limiter import FleetLimiter as FleetLimiter
    from worker.models._limiter import RateLimits as RateLimits
    from worker.models._prices import ModelPrice as ModelPrice
    from worker.models._prices import PriceTable as PriceTable
    from worker.models._structured import parse_structured_text as parse_structured_text
    from worker.models._structured import strict_json_schema as strict_json_schema
    from worker.models._warmup import warm_up_providers as warm_up_providers


__getattr__ = lazy_getattr(__name__)
