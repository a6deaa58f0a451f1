"""Tool calls a model wrote into its text, for providers that did not parse them.

Small local models (Qwen2.5-Coder behind llama.cpp, for one) often answer a tool call
with a ```json fence or ``<tool_call>`` tags holding ``{"name": ..., "arguments": ...}``,
which an OpenAI-compatible server whose chat template expects another syntax returns
as plain text. Left there, the worker would post that JSON as the agent's answer.
``calls_in_text`` turns such blocks into tool calls and takes them out of the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from worker.models._types import ModelResponse, StopReason, ToolCall

# A fenced block (```json ... ``` or a bare ```), or a <tool_call> ... </tool_call> pair.
_BLOCK = re.compile(
    r"```(?:json|tool_call)?[ \t]*\n?(?P<fenced>.*?)```"
    r"|<tool_call>(?P<tagged>.*?)(?:</tool_call>|$)",
    re.DOTALL,
)


def calls_in_text(
    text: str, offered: Sequence[str], *, id_prefix: str
) -> tuple[str, tuple[ToolCall, ...]]:
    """(the text without its call blocks, the calls they hold).

    A block is a call when it is a JSON object with a string ``name`` and an object (or
    JSON text) ``arguments``. Its name is matched to an offered tool, exactly or by the
    part after the server prefix (``get_feed`` for ``hub__get_feed``), when one matches.
    With nothing offered (a closing turn) the blocks are still taken out of the text,
    so an imitation of a call is never taken for an answer, but no call is returned.
    """
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    blocks = [
        (match.start(), match.end(), match.group("fenced") or match.group("tagged") or "")
        for match in _BLOCK.finditer(text)
    ]
    if not blocks and _call_object(text) is not None:
        blocks = [(0, len(text), text)]  # the whole answer is one bare call object
    for start, end, body in blocks:
        call = _call_object(body)
        if call is None:
            continue
        kept.append(text[position:start])
        position = end
        name, arguments = call
        if offered:
            calls.append(
                ToolCall(
                    id=f"{id_prefix}-{len(calls) + 1}",
                    name=_offered_name(name, offered),
                    arguments=arguments,
                )
            )
    kept.append(text[position:])
    return "".join(kept).strip() if position else text, tuple(calls)


def with_text_calls(
    response: ModelResponse, offered: Sequence[str], *, id_prefix: str
) -> ModelResponse:
    """``response`` with the calls its text holds parsed, when the provider returned none."""
    if response.tool_calls or not response.text:
        return response
    text, calls = calls_in_text(response.text, offered, id_prefix=id_prefix)
    if text == response.text and not calls:
        return response
    return ModelResponse(
        text=text,
        tool_calls=calls,
        stop_reason=StopReason.TOOL_USE if calls else response.stop_reason,
        usage=response.usage,
        provider=response.provider,
        model=response.model,
        attempts=response.attempts,
    )


def _call_object(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) when ``body`` is a call object."""
    try:
        value: Any = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return value["name"], arguments
    if isinstance(arguments, dict):
        return value["name"], json.dumps(arguments)
    return None


def _offered_name(name: str, offered: Sequence[str]) -> str:
    if name in offered:
        return name
    by_suffix = [tool for tool in offered if tool.partition("__")[2] == name]
    return by_suffix[0] if len(by_suffix) == 1 else name
