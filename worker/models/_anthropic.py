"""Claude through the official ``anthropic`` SDK (Messages API)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage
from anthropic.types import MessageParam, ToolParam

from hub_client.retry_rules import retry_after_s
from worker.exceptions import ModelError
from worker.models._prices import PriceTable
from worker.models._retry import (
    AttemptFailed,
    RetryingModel,
    RetryPolicy,
    connection_failure,
    error_detail,
)
from worker.models._types import (
    Message,
    ModelRequest,
    ModelResponse,
    StopReason,
    ToolCall,
    ToolSpec,
)

_STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "stop_sequence": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    # The context window ran out mid-answer: as truncated as max_tokens.
    "model_context_window_exceeded": StopReason.MAX_TOKENS,
    "refusal": StopReason.REFUSAL,
}


class AnthropicModel(RetryingModel):
    """Claude models. Use through ``create_model`` unless a test needs its own ``http_client``.

    ``temperature`` (here or on the request) is accepted for parity with other
    providers but never sent: API version 2026-10-21, which anthropic SDK 2.x
    speaks, answers 400 to any sampling parameter.
    """

    provider_name = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        max_output_tokens: int = 4096,
        temperature: float | None = None,
        default_timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        prices: PriceTable | None = None,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        super().__init__(model, default_timeout_s=default_timeout_s, retry=retry, prices=prices)
        self._api_key = api_key
        self._max_output_tokens = max_output_tokens
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, http_client=http_client
        )

    async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
        options: dict[str, Any] = {}
        if request.system:
            options["system"] = request.system
        if request.tools:
            options["tools"] = _tools(request.tools)
        if request.response_schema is not None:
            options["output_config"] = {
                "format": {"type": "json_schema", "schema": request.response_schema}
            }
        try:
            answer = await self._client.messages.create(
                model=self._model,
                max_tokens=request.max_output_tokens or self._max_output_tokens,
                messages=_messages(request.messages),
                timeout=timeout_s,
                **options,
            )
        except anthropic.APIStatusError as exc:
            detail = error_detail(exc.body, exc.message, secret=self._api_key)
            raise AttemptFailed(
                detail, status=exc.status_code, retry_after_s=retry_after_s(exc.response.headers)
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise AttemptFailed(f"no answer within {timeout_s:.1f}s") from exc
        except anthropic.APIConnectionError as exc:
            raise AttemptFailed(connection_failure(exc)) from exc
        except anthropic.AnthropicError as exc:
            raise ModelError(
                f"anthropic model {self._model!r} gave an unreadable answer: {type(exc).__name__}",
                provider=self.provider_name,
                model=self._model,
            ) from exc
        return self._response(answer)

    def _response(self, answer: AnthropicMessage) -> ModelResponse:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in answer.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(
                    ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input))
                )
        usage = answer.usage
        cache_read = usage.cache_read_input_tokens or 0
        cache_write = usage.cache_creation_input_tokens or 0
        answered_model = str(answer.model or self._model)
        return ModelResponse(
            text="".join(texts),
            tool_calls=tuple(calls),
            stop_reason=_STOP_REASONS.get(answer.stop_reason or "", StopReason.OTHER),
            usage=self._usage(
                answered_model,
                input_tokens=usage.input_tokens + cache_read + cache_write,
                output_tokens=usage.output_tokens,
                cache_read_tokens=cache_read,
                cache_write_tokens=cache_write,
            ),
            provider=self.provider_name,
            model=answered_model,
        )


def _tools(tools: Sequence[ToolSpec]) -> list[ToolParam]:
    return [
        {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        for tool in tools
    ]


def _messages(messages: Sequence[Message]) -> list[MessageParam]:
    """Our transcript as Messages API turns.

    Tool results become ``tool_result`` blocks of a user turn; consecutive tool
    results (and a steering message after them) share one user turn, because the
    API wants every result of an assistant turn in the very next user turn.
    """
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    return cast(list[MessageParam], [{"role": role, "content": blocks} for role, blocks in turns])


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
        if message.content:
            result["content"] = message.content
        if message.is_error:
            result["is_error"] = True
        return "user", [result]
    blocks: list[dict[str, Any]] = []
    # The API rejects empty text blocks.
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    if message.role == "assistant":
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call)}
            for call in message.tool_calls
        )
    return message.role, blocks


def _tool_input(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as the object the API requires, even when the model wrote bad JSON."""
    try:
        parsed = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    # Another provider's malformed call in the transcript: keep what was written, as data.
    return {"_unparsed_arguments": call.arguments}
