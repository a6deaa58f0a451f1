"""Trace context through MCP: ``params._meta`` of each tool call, as the MCP conventions say.

The client (the worker's toolbox, the gateway's) writes ``traceparent``/``tracestate``
(and ``baggage`` when the configured propagators carry it) into the ``_meta`` of every
``tools/call``; our servers continue that trace with a SERVER span ``tools/call {tool}``.
The gateway has no MCP caller of ours (a CLI calls it): it continues the ``TRACEPARENT``
its executor handed the CLI, when the call's ``_meta`` has none.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker.tracing._setup import tracer

TOOLS_CALL = "tools/call"


def inject_trace_meta(meta: MutableMapping[str, Any]) -> None:
    """Add the current trace context to an MCP request's ``_meta`` (nothing when none)."""
    propagate.inject(meta)


@contextmanager
def mcp_server_span(
    *, server: str, tool: str, meta: Mapping[str, Any] | None, from_environment: bool = False
) -> Iterator[trace.Span]:
    """The SERVER span of one ``tools/call``, child of the caller's context in ``_meta``.

    ``from_environment``: without one in ``_meta``, continue ``TRACEPARENT``/``TRACESTATE``
    of this process's environment (the gateway a CLI started).
    """
    with tracer().start_as_current_span(
        f"{TOOLS_CALL} {tool}",
        context=_caller_context(meta, from_environment),
        kind=SpanKind.SERVER,
        attributes={
            "mcp.method.name": TOOLS_CALL,
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "agent_worker.mcp.server": server,
        },
        record_exception=False,  # a tool's error text may quote what it read
    ) as span:
        try:
            yield span
        except BaseException as exc:
            if span.is_recording():
                span.set_attribute("error.type", _error_type(exc))
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def environment_context() -> Context | None:
    """The context in ``TRACEPARENT``/``TRACESTATE`` of this process's environment, if any."""
    carrier = {
        key.lower(): value
        for key in ("TRACEPARENT", "TRACESTATE")
        if (value := os.environ.get(key))
    }
    return _valid(propagate.extract(carrier)) if carrier else None


@contextmanager
def attached(context: Context | None) -> Iterator[None]:
    """Make ``context`` the current one for the block (nothing when None)."""
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def _caller_context(meta: Mapping[str, Any] | None, from_environment: bool) -> Context:
    carrier = {
        key: value
        for key, value in (meta or {}).items()
        if key in ("traceparent", "tracestate", "baggage") and isinstance(value, str)
    }
    context = _valid(propagate.extract(carrier)) if carrier else None
    if context is None and from_environment:
        context = environment_context()
    # A server span never joins whatever context happened to be current in the server.
    return context if context is not None else Context()


def _valid(context: Context) -> Context | None:
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _error_type(exc: BaseException) -> str:
    name = type(exc).__name__
    return "tool_error" if name == "ToolError" else name
