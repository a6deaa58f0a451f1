"""The model boundary: the last layer every model request passes before it leaves the process.

``ModelBoundary`` wraps the whole model stack of a task (rate limits, fallbacks,
retries, providers), so every call goes through it: each step, each fallback,
the closing call after a limit. It masks known secrets in the system prompt, every
message (thread, tool results, steering text, the model's own earlier turns and
tool arguments) and the tool descriptions, and it wraps each tool result in the
task's untrusted-content delimiters.

A conversation is sent again with every step, so each text is processed once and
remembered until the next request: the cost per request is the new text, not the
whole conversation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from worker.models._types import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ModelWrapper,
    ToolCall,
    ToolSpec,
)

Redact = Callable[[str], str]
# (tool name, result text) -> the text the model reads.
WrapToolResult = Callable[[str, str], str]


class ModelBoundary(ModelWrapper):
    """A Model that hands ``inner`` only redacted requests with delimited tool results."""

    def __init__(
        self, inner: Model, *, redact: Redact, wrap_tool_result: WrapToolResult | None = None
    ) -> None:
        super().__init__(inner)
        self._redact = redact
        self._wrap = wrap_tool_result
        self._done: dict[tuple[str, str], str] = {}
        self._kept: dict[tuple[str, str], str] = {}

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self._inner.complete(self.prepare(request))

    def prepare(self, request: ModelRequest) -> ModelRequest:
        """The request as it may leave the process (a copy; ``request`` is left as it was)."""
        self._kept = {}
        try:
            return dataclasses.replace(
                request,
                system=self._clean("", request.system),
                system_context=(
                    self._clean("", request.system_context) if request.system_context else ""
                ),
                messages=self._messages(request.messages),
                tools=[self._tool(spec) for spec in request.tools],
            )
        finally:
            # Remember only what this request used: the cache follows the conversation.
            self._done, self._kept = self._kept, {}

    def _messages(self, messages: Sequence[Message]) -> list[Message]:
        names: dict[str, str] = {}
        prepared = []
        for message in messages:
            for call in message.tool_calls:
                names[call.id] = call.name
            if message.role == "tool":
                tool = names.get(message.tool_call_id or "", "unknown")
                content = self._clean(f"tool:{tool}", message.content)
            else:
                content = self._clean("", message.content)
            prepared.append(
                dataclasses.replace(
                    message,
                    content=content,
                    tool_calls=tuple(self._call(call) for call in message.tool_calls),
                )
            )
        return prepared

    def _call(self, call: ToolCall) -> ToolCall:
        arguments = self._clean("", call.arguments)
        if arguments == call.arguments:
            return call
        return dataclasses.replace(call, arguments=arguments)

    def _tool(self, spec: ToolSpec) -> ToolSpec:
        description = self._clean("", spec.description)
        if description == spec.description:
            return spec
        return dataclasses.replace(spec, description=description)

    def _clean(self, role: str, text: str) -> str:
        key = (role, text)
        done = self._done.get(key)
        if done is None:
            done = self._redact(text)
            if role.startswith("tool:") and self._wrap is not None:
                done = self._wrap(role.removeprefix("tool:"), done)
        self._kept[key] = done
        return done
