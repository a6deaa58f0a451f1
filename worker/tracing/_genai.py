"""The agent run as the GenAI semantic conventions name it, each span opened by its layer.

    invoke_agent {agent}     one task run by the pipeline (``traced_agent_run`` decorates
                             the run of a task's wire: it reads the task, nothing else)
      chat {model}           one call to one provider model, its retries as events; a
                             fallback model is a sibling ``chat`` span (``traced_chat``,
                             called by the model's ``complete`` with its request)
      execute_tool {tool}    one tool call the model made (``traced_tool_call``, called by
                             the tool dispatcher with the call)

Each takes what its span names as arguments and the work as a callable; the objects it
reads go through small Protocols, so this package imports nothing from the loop, the
models or the tools. Message content goes on spans only when
``_content.capture_content()`` says so.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar, cast

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker.task import raw_field
from worker.tracing._content import as_json, capture_content, safe_text
from worker.tracing._setup import span, spans_off

# The task id of the agent run in progress: every GenAI span of it names the conversation.
_conversation_id: ContextVar[str | None] = ContextVar("gen_ai_conversation_id", default=None)

_FINISH_REASONS = {
    "end_turn": "stop",
    "tool_use": "tool_call",
    "max_tokens": "length",
    "refusal": "content_filter",
}


# --- what the traced layers hand over -------------------------------------------------


class _Usage(Protocol):
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    cache_read_tokens: int
    cache_write_tokens: int


class _ToolCall(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> str: ...


class _Message(Protocol):
    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...

    @property
    def tool_calls(self) -> Sequence[_ToolCall]: ...

    @property
    def tool_call_id(self) -> str | None: ...


class _Request(Protocol):
    @property
    def messages(self) -> Sequence[_Message]: ...

    @property
    def max_output_tokens(self) -> int | None: ...

    @property
    def temperature(self) -> float | None: ...

    def full_system(self) -> str: ...


class _Response(Protocol):
    text: str
    tool_calls: Sequence[_ToolCall]
    stop_reason: Any
    usage: _Usage
    model: str
    attempts: int


class _Model(Protocol):
    @property
    def provider(self) -> str: ...

    @property
    def name(self) -> str: ...


class _Report(Protocol):
    outcome: Any
    tokens_input: int
    tokens_output: int
    cost_usd: float | None
    error: Any


class _Verdict(Protocol):
    @property
    def report(self) -> _Report: ...


class _ToolRecord(Protocol):
    server: str
    outcome: Any
    is_error: bool
    content: str


# The decorated task run's own type: a decorator changes no signature.
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
# What a traced call returns, as its layer returns it.
R = TypeVar("R")


# --- invoke_agent -----------------------------------------------------------------------


def traced_agent_run(run: F) -> F:
    """Decorates the run of a task (``execute_task``): the ``invoke_agent {agent}`` span of a
    task, named from the task's wire, its first argument; the rest pass through untouched."""

    @functools.wraps(run)
    async def traced(raw: Any, *args: Any, **kwargs: Any) -> Any:
        agent = raw_field(raw, "agent_id")
        task_id = raw_field(raw, "task_id")
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent"}
        if agent:
            attributes |= {"gen_ai.agent.name": agent, "gen_ai.agent.id": agent}
        if task_id:
            attributes["gen_ai.conversation.id"] = task_id
        if task_type := raw_field(raw, "type"):
            attributes["agent_worker.task.type"] = task_type
        token = _conversation_id.set(task_id)
        try:
            with span(
                f"invoke_agent {agent}" if agent else "invoke_agent",
                kind=SpanKind.INTERNAL,
                attributes=attributes,
            ) as current:
                verdict: _Verdict = await run(raw, *args, **kwargs)
                _record_report(current, verdict.report)
                return verdict
        finally:
            _conversation_id.reset(token)

    return cast(F, traced)


def _record_report(span: trace.Span, report: _Report) -> None:
    if not span.is_recording():
        return
    outcome = str(getattr(report.outcome, "value", report.outcome))
    span.set_attribute("agent_worker.outcome", outcome)
    span.set_attribute("gen_ai.usage.input_tokens", report.tokens_input)
    span.set_attribute("gen_ai.usage.output_tokens", report.tokens_output)
    if report.cost_usd is not None:
        span.set_attribute("agent_worker.usage.cost_usd", report.cost_usd)
    if getattr(report.outcome, "fails_job", False):
        error_class = getattr(report.error, "class_", None) or outcome
        span.set_attribute("error.type", error_class)
        span.set_status(Status(StatusCode.ERROR, outcome))


# --- chat -------------------------------------------------------------------------------


async def traced_chat(model: _Model, request: _Request, complete: Callable[[], Awaitable[R]]) -> R:
    """``complete()``, one call of ``model`` with ``request``, in one ``chat {model}`` span."""
    if spans_off():
        return await complete()
    with _model_span(model, request) as current:
        response = await complete()
        if current.is_recording():
            _record_response(current, cast(_Response, response))
        return response


@contextmanager
def _model_span(model: _Model, request: _Request) -> Iterator[trace.Span]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": model.provider,
        "gen_ai.request.model": model.name,
    }
    if request.max_output_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        attributes["gen_ai.request.temperature"] = request.temperature
    if (conversation := _conversation_id.get()) is not None:
        attributes["gen_ai.conversation.id"] = conversation
    with span(f"chat {model.name}", kind=SpanKind.CLIENT, attributes=attributes) as current:
        if current.is_recording() and capture_content():
            system = request.full_system()
            current.set_attribute("gen_ai.system_instructions", _system_json(system))
            current.set_attribute("gen_ai.input.messages", _messages_json(request.messages))
        yield current


def note_retry(*, status: int | None, delay_s: float, attempt: int) -> None:
    """One failed attempt of the current ``chat`` span, retried after ``delay_s``."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            "agent_worker.retry",
            {
                "error.type": str(status) if status is not None else "connection_error",
                "agent_worker.retry.attempt": attempt,
                "agent_worker.retry.delay_s": delay_s,
            },
        )


def _record_response(span: trace.Span, response: _Response) -> None:
    finish = _finish_reason(response.stop_reason)
    span.set_attribute("gen_ai.response.model", response.model)
    span.set_attribute("gen_ai.response.finish_reasons", [finish])
    span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    # Of the input tokens, those the provider's prompt cache served and those it stored.
    span.set_attribute("gen_ai.usage.cache_read.input_tokens", response.usage.cache_read_tokens)
    span.set_attribute(
        "gen_ai.usage.cache_creation.input_tokens", response.usage.cache_write_tokens
    )
    span.set_attribute("agent_worker.llm.attempts", response.attempts)
    if response.usage.cost_usd is not None:
        span.set_attribute("agent_worker.usage.cost_usd", response.usage.cost_usd)
    if capture_content():
        message = {
            "role": "assistant",
            "parts": _parts(response.text, response.tool_calls),
            "finish_reason": finish,
        }
        span.set_attribute("gen_ai.output.messages", as_json([message]))


def _finish_reason(stop_reason: Any) -> str:
    value = str(getattr(stop_reason, "value", stop_reason))
    return _FINISH_REASONS.get(value, value)


def _system_json(system: str) -> str:
    return as_json([{"type": "text", "content": safe_text(system)}])


def _messages_json(messages: Sequence[_Message]) -> str:
    entries = []
    for message in messages:
        if message.role == "tool":
            part = {
                "type": "tool_call_response",
                "id": message.tool_call_id,
                "result": safe_text(message.content),
            }
            entries.append({"role": "tool", "parts": [part]})
        else:
            entries.append(
                {"role": message.role, "parts": _parts(message.content, message.tool_calls)}
            )
    return as_json(entries)


def _parts(text: str, tool_calls: Sequence[_ToolCall]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "content": safe_text(text)}] if text else []
    for call in tool_calls:
        parts.append(
            {
                "type": "tool_call",
                "id": call.id,
                "name": call.name,
                "arguments": safe_text(call.arguments),
            }
        )
    return parts


# --- execute_tool -----------------------------------------------------------------------


async def traced_tool_call(call: _ToolCall, run: Callable[[], Awaitable[R]]) -> R:
    """``run()``, the dispatch of one tool call, in one ``execute_tool {tool}`` span: its
    server and outcome (read from the record ``run`` returns) as the metrics label them."""
    if spans_off():
        return await run()
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }
    if (conversation := _conversation_id.get()) is not None:
        attributes["gen_ai.conversation.id"] = conversation
    with span(
        f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as current:
        if current.is_recording() and capture_content():
            current.set_attribute("gen_ai.tool.call.arguments", safe_text(call.arguments))
        record = await run()
        if current.is_recording():
            _record_tool(current, cast(_ToolRecord, record))
        return record


def _record_tool(span: trace.Span, record: _ToolRecord) -> None:
    outcome = str(getattr(record.outcome, "value", record.outcome))
    span.set_attribute("agent_worker.tool.outcome", outcome)
    if record.server:
        span.set_attribute("agent_worker.tool.server", record.server)
    if record.is_error:
        span.set_attribute("error.type", outcome)
        span.set_status(Status(StatusCode.ERROR, outcome))
    elif capture_content():
        span.set_attribute("gen_ai.tool.call.result", safe_text(record.content))
