"""The model layer: a small Model protocol, providers behind it, and a scripted model."""

from worker.models._anthropic import AnthropicModel
from worker.models._factory import aclose_shared_http_clients, create_model, load_price_table
from worker.models._fallback import FallbackModel
from worker.models._openai import OpenAIModel
from worker.models._prices import ModelPrice, PriceTable
from worker.models._retry import RetryPolicy
from worker.models._scripted import ScriptedModel, Turn
from worker.models._structured import generate, parse_structured, strict_json_schema
from worker.models._types import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    StopReason,
    ToolCall,
    ToolSpec,
    Usage,
)

__all__ = [
    "AnthropicModel",
    "FallbackModel",
    "Message",
    "Model",
    "ModelPrice",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "PriceTable",
    "RetryPolicy",
    "ScriptedModel",
    "StopReason",
    "ToolCall",
    "ToolSpec",
    "Turn",
    "Usage",
    "aclose_shared_http_clients",
    "create_model",
    "generate",
    "load_price_table",
    "parse_structured",
    "strict_json_schema",
]
