"""Claude through the official ``anthropic`` SDK (Messages API)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage

from hub_client.retry_rules import retry_after_s
from worker.exceptions import ModelError
from worker.models._cache import CacheTtl, PromptCache, anthropic_minimum_tokens
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

# The SDK's own encoding of a body: compact, UTF-8 as is, no NaN.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# Fewer characters per token than English text (about 4) or JSON (about 3) ever take:
# a prefix this counts as shorter than a model's minimum is shorter.
_CHARS_PER_TOKEN = 3
# The conversation's breakpoints: read back within seconds by the task's next step.
_CONVERSATION = {"type": "ephemeral"}

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
        prompt_cache: PromptCache | None = None,
    ) -> None:
        super().__init__(model, default_timeout_s=default_timeout_s, retry=retry, prices=prices)
        self._api_key = api_key
        self._max_output_tokens = max_output_tokens
        self._cache = prompt_cache
        self._tool_specs: Sequence[ToolSpec] = ()
        self._tool_params: list[dict[str, Any]] = []
        self._tools_chars = 0
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, http_client=http_client
        )

    async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
        body = self._body(request)
        try:
            # ``messages.create`` would copy the body once more, container by container
            # (``async_prepare_request_data``: a third of a call's CPU), to drop the SDK's
            # "not given" markers; ours has none and is plain JSON. The same request, through
            # the SDK's own ``post``, with the body already encoded as the SDK encodes it.
            answer = await self._client.post(
                "/v1/messages",
                content=_JSON.encode(body).encode(),
                cast_to=AnthropicMessage,
                options={"timeout": timeout_s, "headers": {"Content-Type": "application/json"}},
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

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The Messages API body; with a prompt cache, its breakpoints (``_CacheLayout``)."""
        body: dict[str, Any] = {
            "max_tokens": request.max_output_tokens or self._max_output_tokens,
            "messages": _messages(request.messages),
            "model": self._model,
        }
        if request.response_schema is not None:
            body["output_config"] = {
                "format": {"type": "json_schema", "schema": request.response_schema}
            }
        tools = self._tools(request.tools)
        if tools and not request.tools_callable:
            body["tool_choice"] = {"type": "none"}
        if self._cache is None:
            # Today's shape: one system text, nothing marked.
            if request.full_system():
                body["system"] = request.full_system()
            if tools:
                body["tools"] = tools
            return body
        layout = _CacheLayout(self._cache.ttl, anthropic_minimum_tokens(self._model))
        if tools:
            body["tools"] = layout.tools(tools, self._tools_chars)
        system = layout.system(request.system, request.system_context)
        if system:
            body["system"] = system
        if not request.last_call:
            layout.conversation(body["messages"])
        return body

    def _tools(self, tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
        """The tools as the API takes them, converted again only when the specs change."""
        if len(tools) != len(self._tool_specs) or any(
            new is not old for new, old in zip(tools, self._tool_specs, strict=True)
        ):
            self._tool_specs = tuple(tools)
            self._tool_params = _tools(tools)
            self._tools_chars = sum(len(_JSON.encode(tool)) for tool in self._tool_params)
        # A copy per call: a breakpoint is added to the copy's last tool, not to the kept one.
        return [dict(tool) for tool in self._tool_params]

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
        # Of the writes, those kept for an hour (billed 2x the input price, not 1.25x).
        written = usage.cache_creation
        cache_write_1h = (written.ephemeral_1h_input_tokens or 0) if written else 0
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
                cache_write_1h_tokens=cache_write_1h,
            ),
            provider=self.provider_name,
            model=answered_model,
        )


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        for tool in tools
    ]


class _CacheLayout:
    """Where one request marks its cache breakpoints (at most four; the API refuses a fifth).

    The API reads tools, then system, then messages as one prefix, and caches it up to
    each marked block. Marked here: the last tool and the agent's prompt and skills (the
    same in every task of the agent: read back by its next task, with the agent's TTL),
    then the end of the conversation as the previous call sent it and as this call sends
    it (read back by this task's next step: 5 minutes). A prefix shorter than the model's
    minimum is never cached, so it is not marked.
    """

    def __init__(self, ttl: CacheTtl, minimum_tokens: int) -> None:
        self._shared: dict[str, str] = {"type": "ephemeral"}
        if ttl != "5m":
            self._shared["ttl"] = ttl
        self._minimum_chars = minimum_tokens * _CHARS_PER_TOKEN
        self._chars = 0

    def tools(self, tools: list[dict[str, Any]], chars: int) -> list[dict[str, Any]]:
        self._chars += chars
        if self._long_enough():
            tools[-1]["cache_control"] = self._shared
        return tools

    def system(self, stable: str, context: str) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if stable:
            self._chars += len(stable)
            blocks.append({"type": "text", "text": stable})
            if self._long_enough():
                blocks[-1]["cache_control"] = self._shared
        if context:
            self._chars += len(context)
            blocks.append({"type": "text", "text": context})
        return blocks

    def conversation(self, turns: list[dict[str, Any]]) -> None:
        """Mark the last turn, and the last user turn before the model's latest answer (where
        the previous call ended: the API looks back only about 20 blocks from a mark)."""
        ends = [len(turns) - 1]
        if len(turns) >= 3 and turns[-1]["role"] == "user":
            ends.insert(0, len(turns) - 3)
        marked = set(ends)
        for index, turn in enumerate(turns):
            self._chars += sum(_block_chars(block) for block in turn["content"])
            if index in marked and self._long_enough():
                turn["content"][-1]["cache_control"] = _CONVERSATION

    def _long_enough(self) -> bool:
        return self._chars >= self._minimum_chars


def _block_chars(block: dict[str, Any]) -> int:
    text = block.get("text") or block.get("content") or ""
    if block.get("type") == "tool_use":
        return len(block["name"]) + len(_JSON.encode(block["input"]))
    return len(text) if isinstance(text, str) else 0


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
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
    return [{"role": role, "content": blocks} for role, blocks in turns]


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
