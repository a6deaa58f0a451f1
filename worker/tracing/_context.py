"""Trace context that comes from outside a span: a process's environment.

Across MCP the SDK itself carries the context (mcp 2.x puts ``traceparent`` in the
``params._meta`` of each request and its servers continue it in a SERVER span); a
coding-agent CLI sends no ``_meta`` context, so the gateway it starts continues the
``TRACEPARENT`` its executor handed the CLI, and ``agent-worker enqueue`` the one its
caller set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context


def environment_context() -> Context | None:
    """The context in ``TRACEPARENT``/``TRACESTATE`` of this process's environment, if any."""
    carrier = {
        key.lower(): value
        for key in ("TRACEPARENT", "TRACESTATE")
        if (value := os.environ.get(key))
    }
    if not carrier:
        return None
    context = propagate.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


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
