"""Which messages our MCP servers trace: every one, except an untraced session set-up.

The mcp SDK puts a SERVER span around each message, continuing the trace context the
client put in ``params._meta``. A session's set-up (``initialize``, ``ping``, the
``initialized`` notification) sent with no context comes from a health probe or
``agent-worker check`` (the worker sends one at every start): each would be a root trace
of its own, in every backend, for nothing an operator follows. Sent inside a trace (a
task opening its toolbox), it is traced as ever.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from opentelemetry import propagate, trace

_SET_UP = frozenset({"initialize", "ping", "notifications/initialized"})


class UntracedSetUp:
    """Wraps the SDK's tracing middleware: an untraced set-up message gets no span."""

    def __init__(self, traced: Any) -> None:
        self._traced = traced

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method in _SET_UP and not _carries_context(ctx.meta):
            return await call_next(ctx)
        result: HandlerResult = await self._traced(ctx, call_next)
        return result


def skip_untraced_set_up(server: MCPServer[Any]) -> None:
    """Put ``UntracedSetUp`` around the SDK's tracing middleware of ``server``."""
    from mcp.server._otel import OpenTelemetryMiddleware

    middleware = server.middleware
    for index, layer in enumerate(middleware):
        if isinstance(layer, OpenTelemetryMiddleware):
            middleware[index] = UntracedSetUp(layer)


def _carries_context(meta: Any) -> bool:
    if not meta:
        return False
    context = propagate.extract(dict(meta))
    return trace.get_current_span(context).get_span_context().is_valid
