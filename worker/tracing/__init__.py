"""OpenTelemetry traces: one trace from the producer's enqueue to the Hub's reply.

docs/how-to/tracing.md draws the trace tree. What each part of the worker does:

    configure_tracing, flush_spans    turn the SDK on from OTEL_* variables; flush before exit
    publishing, traced_job            across the queue: the producer's context rides in the
                                      task; each run of its job is a CONSUMER span
    traced_agent_run, traced_chat,    the GenAI spans: invoke_agent, chat (retries as events),
    note_retry, traced_tool_call      execute_tool
    environment_context, attached     the context a process was handed (TRACEPARENT)
    TracingTransport                  HTTP client spans (the Hub, mcp-web's fetches)
    traced_cli_run, trace_environment, gateway_trace_environment
                                      a CLI executor's run and the context handed to it

Into MCP, the mcp SDK itself carries the context (``params._meta``) and makes the client
and server spans. Only the OpenTelemetry API is required; without the SDK every span is a
no-op. Message content reaches spans only with
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, redacted.
"""

from __future__ import annotations

from worker.tracing._cli import gateway_trace_environment, trace_environment, traced_cli_run
from worker.tracing._content import CAPTURE_VARIABLE, capture_content
from worker.tracing._context import attached, environment_context
from worker.tracing._genai import note_retry, traced_agent_run, traced_chat, traced_tool_call
from worker.tracing._http import TracingTransport
from worker.tracing._queue import creation_context, processing, publishing, traced_job
from worker.tracing._setup import (
    TRACER_NAME,
    configure_tracing,
    flush_spans,
    sampled_trace_id,
    tracing_enabled,
)

__all__ = [
    "CAPTURE_VARIABLE",
    "TRACER_NAME",
    "TracingTransport",
    "attached",
    "capture_content",
    "configure_tracing",
    "creation_context",
    "environment_context",
    "flush_spans",
    "gateway_trace_environment",
    "note_retry",
    "processing",
    "publishing",
    "sampled_trace_id",
    "trace_environment",
    "traced_agent_run",
    "traced_chat",
    "traced_cli_run",
    "traced_job",
    "traced_tool_call",
    "tracing_enabled",
]
