"""The model layer: a small Model protocol, providers behind it, and a scripted model."""

from worker.models._scripted import ScriptedModel, Turn
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
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "StopReason",
    "ToolCall",
    "ToolSpec",
    "Turn",
    "Usage",
]
