"""One offline call per provider in the worker parent, so forked job processes start warm.

The provider SDKs build their pydantic schemas and request transforms on first
use: the first call of a process costs 15-20 ms more than the next ones. Job
processes are forks of the worker parent, so one call per provider its agents use, there,
against a canned answer (no network), spares every job that cost and the SDK's import.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import Any

import anyio
import httpx2

from worker.logs import log_event
from worker.models._cache import PromptCache
from worker.models._types import Message, ModelRequest, ToolCall, ToolSpec

_TOOL_CALL_ARGUMENTS = '{"post_id": "p-1"}'
_OPENAI_ANSWER: dict[str, Any] = {
    "id": "warm-up",
    "object": "chat.completion",
    "created": 0,
    "model": "warm-up",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Reading the thread.",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "read", "arguments": _TOOL_CALL_ARGUMENTS},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_ANTHROPIC_ANSWER: dict[str, Any] = {
    "id": "warm-up",
    "type": "message",
    "role": "assistant",
    "model": "warm-up",
    "content": [
        {"type": "text", "text": "Reading the thread."},
        {"type": "tool_use", "id": "call-1", "name": "read", "input": {"post_id": "p-1"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
# A conversation of the usual shape: a task, a tool call, its result, tools offered.
_REQUEST = ModelRequest(
    system="warm-up",
    messages=[
        Message(role="user", content="warm-up"),
        Message(
            role="assistant",
            content="",
            tool_calls=(ToolCall(id="call-0", name="read", arguments=_TOOL_CALL_ARGUMENTS),),
        ),
        Message(role="tool", content="warm-up", tool_call_id="call-0"),
    ],
    tools=[
        ToolSpec(
            name="read",
            description="warm-up",
            input_schema={"type": "object", "properties": {"post_id": {"type": "string"}}},
        )
    ],
    timeout_s=10.0,
)


def _canned_answer(request: httpx2.Request) -> httpx2.Response:
    if request.url.path.endswith("/chat/completions"):
        return httpx2.Response(200, json=_OPENAI_ANSWER)
    return httpx2.Response(200, json=_ANTHROPIC_ANSWER)


# Modules an SDK imports only on first use, beyond what the canned call reaches.
_FIRST_USE_MODULES = {
    "openai": (
        "openai.resources.chat.chat",  # AsyncOpenAI.chat is a lazy attribute
        "openai.resources.chat.completions.completions",
    ),
}


async def _call_each_provider(providers: Collection[str]) -> None:
    from worker.models._factory import provider_model_class

    for provider in sorted(providers):
        for module in _FIRST_USE_MODULES.get(provider, ()):
            importlib.import_module(module)
        model_class = provider_model_class(provider)
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(_canned_answer)) as http:
            model = model_class(
                "warm-up",
                api_key="warm-up",
                base_url="http://warm-up.invalid",
                http_client=http,
                # The request shape tasks send (PROMPT_CACHE's default).
                prompt_cache=PromptCache(key="warm-up"),
            )
            await model.complete(_REQUEST)


def warm_up_providers(providers: Collection[str]) -> None:
    """Import the SDK of each of ``providers`` and make one canned call with it in this
    process; never raises."""
    try:
        anyio.run(_call_each_provider, providers)
    except Exception as exc:  # a cold start is slower, not broken
        log_event("provider_warm_up_failed", "warning", error=f"{type(exc).__name__}: {exc}")
