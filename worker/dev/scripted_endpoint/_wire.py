"""Answers in the exact shapes the official SDKs parse: Chat Completions and Messages,
whole or as server-sent events, and each API's error envelope."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from worker.dev.scripted_endpoint._conversation import Api, Conversation
from worker.dev.scripted_endpoint._scenarios import ScriptedTurn

StopReason = Literal["end_turn", "tool_use", "max_tokens"]

_OPENAI_FINISH_REASONS: dict[StopReason, str] = {
    "end_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}
# Error types as each provider names them, by HTTP status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# Small pieces, so clients really have to put streamed text and arguments back together.
_TEXT_PIECE_CHARS = 12
_ARGUMENT_PIECES = 3


@dataclass(frozen=True, slots=True)
class AnswerToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Answer:
    """A successful model answer, independent of the API it will be sent in."""

    message_id: str
    model: str
    text: str
    tool_calls: tuple[AnswerToolCall, ...]
    stop_reason: StopReason
    input_tokens: int
    output_tokens: int


def answer_for(turn: ScriptedTurn, conversation: Conversation) -> Answer:
    """The answer a (non-error, non-dynamic) turn gives to this request."""
    call_prefix = "call_" if conversation.api == "openai" else "toolu_"
    calls = tuple(
        AnswerToolCall(
            call_id=call_prefix + secrets.token_hex(12),
            name=call.name,
            arguments=call.arguments
            if isinstance(call.arguments, str)
            else json.dumps(call.arguments),
        )
        for call in turn.tool_calls
    )
    stop_reason: StopReason = turn.stop_reason or ("tool_use" if calls else "end_turn")
    if turn.usage is not None:
        input_tokens, output_tokens = turn.usage.input_tokens, turn.usage.output_tokens
    else:
        # Roughly four characters per token, as providers' rules of thumb say.
        input_tokens = max(1, conversation.request_chars // 4)
        answer_chars = len(turn.text) + sum(len(c.name) + len(c.arguments) for c in calls)
        output_tokens = max(1, answer_chars // 4)
    id_prefix = "chatcmpl-" if conversation.api == "openai" else "msg_"
    return Answer(
        message_id=id_prefix + secrets.token_hex(12),
        model=conversation.model or "scripted",
        text=turn.text,
        tool_calls=calls,
        stop_reason=stop_reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def error_body(api: Api, status: int, error: Mapping[str, Any] | None) -> dict[str, Any]:
    """The API's error envelope; ``error`` overrides the default type and message."""
    error_type = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    detail: dict[str, Any] = {
        "type": error_type,
        "message": f"scripted endpoint answered {status} ({error_type})",
    }
    if api == "openai":
        detail.update({"param": None, "code": error_type})
    detail.update(error or {})
    if api == "openai":
        return {"error": detail}
    return {"type": "error", "error": detail}


def openai_completion(answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.text or None,
        "refusal": None,
        "annotations": [],
    }
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in answer.tool_calls
        ]
    return {
        "id": answer.message_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answer.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _OPENAI_FINISH_REASONS[answer.stop_reason],
            }
        ],
        "usage": _openai_usage(answer),
        "system_fingerprint": None,
    }


def openai_chunks(answer: Answer, *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """Chat Completions chunks in the order OpenAI streams them (the caller adds ``[DONE]``)."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": answer.message_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": answer.model,
            "system_fingerprint": None,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if include_usage:
            body["usage"] = None
        return body

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(answer.text, _TEXT_PIECE_CHARS):
        yield chunk({"content": piece})
    for index, call in enumerate(answer.tool_calls):
        opening = {
            "index": index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield chunk({"tool_calls": [opening]})
        for piece in _split(call.arguments, _ARGUMENT_PIECES):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, _OPENAI_FINISH_REASONS[answer.stop_reason])
    if include_usage:
        usage_chunk = chunk({})
        usage_chunk["choices"] = []
        usage_chunk["usage"] = _openai_usage(answer)
        yield usage_chunk


def anthropic_message(answer: Answer) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if answer.text:
        content.append({"type": "text", "text": answer.text})
    content.extend(
        {"type": "tool_use", "id": call.call_id, "name": call.name, "input": _input(call)}
        for call in answer.tool_calls
    )
    return {
        "id": answer.message_id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content,
        "stop_reason": answer.stop_reason,
        "stop_sequence": None,
        "usage": _anthropic_usage(answer.input_tokens, answer.output_tokens),
    }


def anthropic_events(answer: Answer) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` in the order the Messages API streams them."""
    opening = anthropic_message(answer)
    opening.update(
        content=[],
        stop_reason=None,
        usage=_anthropic_usage(answer.input_tokens, min(1, answer.output_tokens)),
    )
    yield "message_start", {"type": "message_start", "message": opening}
    yield "ping", {"type": "ping"}
    index = 0
    if answer.text:
        yield _block_start(index, {"type": "text", "text": ""})
        for piece in _pieces(answer.text, _TEXT_PIECE_CHARS):
            yield _block_delta(index, {"type": "text_delta", "text": piece})
        yield _block_stop(index)
        index += 1
    for call in answer.tool_calls:
        yield _block_start(
            index, {"type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}
        )
        for piece in _split(call.arguments, _ARGUMENT_PIECES):
            yield _block_delta(index, {"type": "input_json_delta", "partial_json": piece})
        yield _block_stop(index)
        index += 1
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": answer.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": answer.output_tokens},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def sse_data(data: Mapping[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def sse_event(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\n".encode() + sse_data(data)


def _openai_usage(answer: Answer) -> dict[str, Any]:
    return {
        "prompt_tokens": answer.input_tokens,
        "completion_tokens": answer.output_tokens,
        "total_tokens": answer.input_tokens + answer.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _anthropic_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "service_tier": "standard",
    }


def _input(call: AnswerToolCall) -> Any:
    # The Messages API always sends an object; scripted non-JSON arguments pass through
    # as the raw string, so a client can be tested against arguments it cannot use.
    try:
        return json.loads(call.arguments)
    except json.JSONDecodeError:
        return call.arguments


def _block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_start", {
        "type": "content_block_start",
        "index": index,
        "content_block": block,
    }


def _block_delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> tuple[str, dict[str, Any]]:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _split(text: str, parts: int) -> Iterator[str]:
    if not text:
        return
    size = max(1, -(-len(text) // parts))
    yield from _pieces(text, size)
