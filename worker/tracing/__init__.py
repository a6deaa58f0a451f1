"""OpenTelemetry traces: one trace from the producer's enqueue to the Hub's reply.

docs/how-to/tracing.md draws the trace tree. What each part of the worker does:

    configure_tracing, flush_spans    turn the SDK on from OTEL_* variables; flush before exit
    deliver_job_spans, sweep_job_spans
                                      a forked job process's spans, exported by its worker
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

from worker.tracing._cli import gateway_trace_environment as gateway_trace_environment
from worker.tracing._cli import trace_environment as trace_environment
from worker.tracing._cli import traced_cli_run as traced_cli_run
from worker.tracing._context import attached as attached
from worker.tracing._context import environment_context as environment_context
from worker.tracing._genai import note_retry as note_retry
from worker.tracing._genai import traced_agent_run as traced_agent_run
from worker.tracing._genai import traced_chat as traced_chat
from worker.tracing._genai import traced_tool_call as traced_tool_call
from worker.tracing._http import TracingTransport as TracingTransport
from worker.tracing._queue import publishing as publishing
from worker.tracing._queue import traced_job as traced_job
from worker.tracing._relay import deliver_job_spans as deliver_job_spans
from worker.tracing._relay import sweep_job_spans as sweep_job_spans
from worker.tracing._setup import configure_tracing as configure_tracing
from worker.tracing._setup import flush_spans as flush_spans
from worker.tracing._setup import sampled_trace_id as sampled_trace_id
