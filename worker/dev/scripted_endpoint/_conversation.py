"""One view of a model request, whichever API it came in: texts, offered tools, tool exchanges."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["openai", "anthropic"]


class BadModelRequest(ValueError):
    """The request body is not something the API would accept; answered as a 400."""


@dataclass(frozen=True, slots=True)
class OfferedTool:
    name: str
    input_schema: Mapping[str, Any]

    @property
    def properties(self) -> Mapping[str, Any]:
        properties = self.input_schema.get("properties")
        return properties if isinstance(properties, Mapping) else {}


@dataclass(frozen=True, slots=True)
class ToolExchange:
    """A tool call the assistant made, with the result sent back for it (None if none yet)."""

    call_id: str
    name: str
    arguments: str
    result: str | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    role: Literal["user", "assistant", "tool"]
    text: str


@dataclass(frozen=True, slots=True)
class Conversation:
    api: Api
    model: str
    system: str
    turns: tuple[Turn, ...]
    # The tools the model may call: none when the request lists them with a tool_choice of
    # none (a closing call), as a real provider answers.
    tools: tuple[OfferedTool, ...]
    exchanges: tuple[ToolExchange, ...]
    stream: bool
    include_usage: bool
    request_chars: int
    max_tokens: int | None = field(default=None)

    def texts(self) -> Iterator[str]:
        """Every text in the request, system prompt first, in conversation order."""
        if self.system:
            yield self.system
        for turn in self.turns:
            yield turn.text

    def user_texts(self) -> list[str]:
        return [turn.text for turn in self.turns if turn.role == "user"]

    def last_user_text(self) -> str:
        for turn in reversed(self.turns):
            if turn.role == "user" and turn.text.strip():
                return turn.text
        return ""

    def tool(self, short_name: str) -> OfferedTool | None:
        """The offered tool called ``short_name`` under any prefix CLIs and the worker use:
        ``hub__get_thread``, ``mcp__hub__get_thread``, ``hub_get_thread`` or plain."""
        for tool in self.tools:
            if tool.name == short_name or tool.name.endswith("_" + short_name):
                return tool
        return None


def openai_conversation(body: Mapping[str, Any], *, request_chars: int) -> Conversation:
    messages = _list_field(body, "messages")
    system_parts: list[str] = []
    turns: list[Turn] = []
    calls: list[ToolExchange] = []
    results: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, Mapping):
            raise BadModelRequest("each message must be an object")
        role = message.get("role")
        text = _text_of(message.get("content"))
        if role in ("system", "developer"):
            system_parts.append(text)
        elif role == "user":
            turns.append(Turn("user", text))
        elif role == "assistant":
            turns.append(Turn("assistant", text))
            for call in message.get("tool_calls") or ():
                if not isinstance(call, Mapping):
                    raise BadModelRequest("each tool call must be an object")
                function = call.get("function") or {}
                calls.append(
                    ToolExchange(
                        call_id=str(call.get("id", "")),
                        name=str(function.get("name", "")),
                        arguments=str(function.get("arguments", "")),
                    )
                )
        elif role in ("tool", "function"):
            turns.append(Turn("tool", text))
            results[str(message.get("tool_call_id", ""))] = text
        else:
            raise BadModelRequest(f"unknown message role {role!r}")
    tools = []
    for tool in body.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name"):
            schema = function.get("parameters")
            tools.append(
                OfferedTool(str(function["name"]), schema if isinstance(schema, Mapping) else {})
            )
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, Mapping) and bool(
        stream_options.get("include_usage")
    )
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    return Conversation(
        api="openai",
        model=str(body.get("model") or ""),
        system="\n\n".join(system_parts),
        turns=tuple(turns),
        tools=() if body.get("tool_choice") == "none" else tuple(tools),
        exchanges=_paired(calls, results),
        stream=bool(body.get("stream")),
        include_usage=include_usage,
        request_chars=request_chars,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
    )


def anthropic_conversation(body: Mapping[str, Any], *, request_chars: int) -> Conversation:
    messages = _list_field(body, "messages")
    turns: list[Turn] = []
    calls: list[ToolExchange] = []
    results: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            raise BadModelRequest("each message must be an object with role user or assistant")
        role = message["role"]
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        texts: list[str] = []
        for block in blocks:
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text") or ""))
            elif kind == "tool_use":
                calls.append(
                    ToolExchange(
                        call_id=str(block.get("id", "")),
                        name=str(block.get("name", "")),
                        arguments=_json_text(block.get("input")),
                    )
                )
            elif kind == "tool_result":
                result = _text_of(block.get("content"))
                results[str(block.get("tool_use_id", ""))] = result
                turns.append(Turn("tool", result))
        if texts:
            turns.append(Turn(role, "\n".join(texts)))
    tools = [
        OfferedTool(str(tool["name"]), tool.get("input_schema") or {})
        for tool in body.get("tools") or ()
        if isinstance(tool, Mapping) and tool.get("name")
    ]
    max_tokens = body.get("max_tokens")
    return Conversation(
        api="anthropic",
        model=str(body.get("model") or ""),
        system=_text_of(body.get("system")),
        turns=tuple(turns),
        tools=() if body.get("tool_choice") == {"type": "none"} else tuple(tools),
        exchanges=_paired(calls, results),
        stream=bool(body.get("stream")),
        include_usage=True,
        request_chars=request_chars,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
    )


def _list_field(body: Mapping[str, Any], name: str) -> Sequence[Any]:
    value = body.get(name)
    if not isinstance(value, list):
        raise BadModelRequest(f"'{name}' must be a list")
    return value


def _paired(calls: Sequence[ToolExchange], results: Mapping[str, str]) -> tuple[ToolExchange, ...]:
    return tuple(
        ToolExchange(call.call_id, call.name, call.arguments, results.get(call.call_id))
        for call in calls
    )


def _text_of(content: Any) -> str:
    """Text of a content field: a string, or a list of parts/blocks with ``text``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or "")
            for part in content
            if isinstance(part, Mapping) and part.get("text")
        )
    return str(content)


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
