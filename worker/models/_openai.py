"""OpenAI and OpenAI-compatible servers (vLLM, Ollama, LiteLLM) through the ``openai`` SDK.

Chat Completions with function tools: the one API every compatible server speaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import httpx2
import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from hub_client.retry_rules import retry_after_s
from worker.exceptions import ModelError
from worker.logs import log_event
from worker.models._cache import PromptCache
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

# Endpoints (base URLs) that answered 400 to ``prompt_cache_key``, for this process.
_REFUSE_CACHE_KEY: set[str] = set()

_STOP_REASONS = {
    "stop": StopReason.END_TURN,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
}


class OpenAIModel(RetryingModel):
    """OpenAI chat models, or any server at ``base_url`` that speaks Chat Completions.

    Tool-call arguments stay the raw text the model wrote, valid JSON or not,
    so the loop can tell the model what was wrong with them.
    """

    provider_name = "openai"

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
        self._temperature = temperature
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=0, http_client=http_client
        )
        # OpenAI itself wants max_completion_tokens (reasoning models reject max_tokens);
        # compatible servers all understand max_tokens, not all the newer name.
        official = self._client.base_url.host == "api.openai.com"
        self._max_tokens_field = "max_completion_tokens" if official else "max_tokens"
        # The server caches a repeated prefix by itself; the key keeps one agent's requests
        # where that cache is.
        self._cache_key = prompt_cache.key if prompt_cache and prompt_cache.send_key else ""
        self._cached_prefix = prompt_cache is not None

    async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
        options: dict[str, Any] = {
            self._max_tokens_field: request.max_output_tokens or self._max_output_tokens
        }
        temperature = request.temperature if request.temperature is not None else self._temperature
        if temperature is not None:
            options["temperature"] = temperature
        if request.tools:
            options["tools"] = _tools(request.tools)
            if not request.tools_callable:
                options["tool_choice"] = "none"
        if request.response_schema is not None:
            options["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.response_schema_name,
                    "schema": request.response_schema,
                    "strict": True,
                },
            }
        body = {
            "model": self._model,
            "messages": self._messages(request),
            **options,
        }
        endpoint = str(self._client.base_url)
        if self._cache_key and endpoint not in _REFUSE_CACHE_KEY:
            body["prompt_cache_key"] = self._cache_key
        try:
            completion = await self._post(body, timeout_s)
        except openai.BadRequestError as exc:
            named = "prompt_cache_key" in f"{exc.message} {exc.body}"
            if "prompt_cache_key" not in body or not named:
                raise self._failed(exc, timeout_s) from exc
            # A compatible server that refuses fields it does not know: once without the
            # key, and never again to this endpoint in this process.
            _REFUSE_CACHE_KEY.add(endpoint)
            del body["prompt_cache_key"]
            log_event("prompt_cache_key_refused", "warning", model=self._model)
            try:
                completion = await self._post(body, timeout_s)
            except openai.OpenAIError as retry_exc:
                raise self._failed(retry_exc, timeout_s) from retry_exc
        except openai.OpenAIError as exc:
            raise self._failed(exc, timeout_s) from exc
        return self._response(completion)

    def _messages(self, request: ModelRequest) -> list[ChatCompletionMessageParam]:
        """The conversation; with a prompt cache, the task's own instructions open its
        first message instead of closing the system message.

        Chat templates render the tools after the whole system message (Qwen2.5's, Hermes'),
        so a per-task line in it (the notice's nonce) would end the prefix a server keeps
        before the tools, and every task would compute them again. A second system message
        would keep them apart too, but some templates refuse one (Mistral's, Gemma's); the
        first user message is accepted by all.
        """
        if not self._cached_prefix:
            return _messages(request.full_system(), request.messages)
        return _messages(request.system, request.messages, opening=request.system_context)

    async def _post(self, body: dict[str, Any], timeout_s: float) -> ChatCompletion:
        # The body is plain JSON already: ``chat.completions.create`` would walk it
        # against its TypedDicts (``async_maybe_transform``, a third of a call's CPU)
        # to rename nothing. The same request, through the SDK's own ``post``.
        return await self._client.post(
            "/chat/completions",
            body=body,
            cast_to=ChatCompletion,
            options={"timeout": timeout_s, "security": {"bearer_auth": True}},
        )

    def _failed(self, exc: openai.OpenAIError, timeout_s: float) -> AttemptFailed | ModelError:
        """What an SDK error means to the retry layer."""
        if isinstance(exc, openai.APIStatusError):
            detail = error_detail(exc.body, exc.message, secret=self._api_key)
            return AttemptFailed(
                detail, status=exc.status_code, retry_after_s=retry_after_s(exc.response.headers)
            )
        if isinstance(exc, openai.APITimeoutError):
            return AttemptFailed(f"no answer within {timeout_s:.1f}s")
        if isinstance(exc, openai.APIConnectionError):
            return AttemptFailed(connection_failure(exc))
        return self._unreadable(type(exc).__name__)

    def _response(self, completion: ChatCompletion) -> ModelResponse:
        if not completion.choices:
            raise self._unreadable("no choices in the answer")
        choice = completion.choices[0]
        message = choice.message
        calls = tuple(
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
            for call in message.tool_calls or ()
            if call.type == "function"
        )
        stop_reason = _STOP_REASONS.get(choice.finish_reason, StopReason.OTHER)
        if message.refusal:
            stop_reason = StopReason.REFUSAL
        elif calls and stop_reason is StopReason.END_TURN:
            # Some compatible servers report "stop" even when the model called tools.
            stop_reason = StopReason.TOOL_USE
        usage = completion.usage
        cached = 0
        if usage is not None and usage.prompt_tokens_details is not None:
            cached = usage.prompt_tokens_details.cached_tokens or 0
        answered_model = completion.model or self._model
        return ModelResponse(
            text=message.content or message.refusal or "",
            tool_calls=calls,
            stop_reason=stop_reason,
            usage=self._usage(
                answered_model,
                input_tokens=usage.prompt_tokens if usage is not None else 0,
                output_tokens=usage.completion_tokens if usage is not None else 0,
                cache_read_tokens=cached,
            ),
            provider=self.provider_name,
            model=answered_model,
        )

    def _unreadable(self, what: str) -> ModelError:
        return ModelError(
            f"openai model {self._model!r} gave an unreadable answer: {what}",
            provider=self.provider_name,
            model=self._model,
        )


def _tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionToolUnionParam]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
            },
        }
        for tool in tools
    ]


def _messages(
    system: str, messages: Sequence[Message], *, opening: str = ""
) -> list[ChatCompletionMessageParam]:
    """``opening`` starts the first user message (one of its own when the conversation does
    not begin with the user)."""
    converted: list[dict[str, Any]] = []
    if system:
        converted.append({"role": "system", "content": system})
    turns = [_message(message) for message in messages]
    if opening:
        if turns and turns[0]["role"] == "user":
            turns[0] = {"role": "user", "content": f"{opening}\n\n{turns[0]['content']}"}
        else:
            turns.insert(0, {"role": "user", "content": opening})
    converted.extend(turns)
    return cast(list[ChatCompletionMessageParam], converted)


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": _tool_result_text(message),
        }
    if message.role == "user":
        return {"role": "user", "content": message.content}
    assistant: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    if message.tool_calls:
        assistant["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    return assistant


def _tool_result_text(message: Message) -> str:
    # Chat Completions has no error flag on tool results: the text has to say it.
    if message.is_error and not message.content.lstrip().lower().startswith("error"):
        return f"Error: {message.content}"
    return message.content
