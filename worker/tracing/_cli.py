"""A coding-agent CLI's run in the trace, and the context handed to the CLI's process.

A CLI runs a whole task as its own agent in another process: one CLIENT span
``invoke_agent {executor}`` (the conventions' span for invoking an agent elsewhere)
covers it. ``TRACEPARENT``/``TRACESTATE`` in the CLI's environment (the convention for
carrying context in environment variables) let a CLI that reads them, and the gateway it
starts, continue the trace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker.tracing._setup import span

# Passed on to the gateway, so its spans reach the same backend; never the headers
# (OTEL_EXPORTER_OTLP_HEADERS may hold a collector's token, and the CLI can read the block).
_PASSED_ON = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
)


_CONTEXT_KEYS = ("traceparent", "tracestate")


# What a traced CLI run returns, as its executor returns it.
R = TypeVar("R")


class _CliResult(Protocol):
    outcome: Any
    error: BaseException | None


async def traced_cli_run(
    run: Callable[[], Awaitable[R]], *, executor: str, task_id: str, agent: str
) -> R:
    """``run()``, one run of the CLI ``executor`` for a task of ``agent``, in one span, with
    the outcome of the result it returns."""
    with span(
        f"invoke_agent {executor}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": executor,
            "gen_ai.conversation.id": task_id,
            "agent_worker.agent": agent,
        },
    ) as current:
        result = await run()
        _record_result(current, cast(_CliResult, result))
        return result


def _record_result(span: trace.Span, result: _CliResult) -> None:
    if not span.is_recording():
        return
    outcome = str(getattr(result.outcome, "value", result.outcome))
    span.set_attribute("agent_worker.outcome", outcome)
    if result.error is not None:
        span.set_attribute("error.type", type(result.error).__name__)
        span.set_status(Status(StatusCode.ERROR, outcome))


def trace_environment() -> dict[str, str]:
    """``TRACEPARENT``/``TRACESTATE`` of the current span, for a child process's environment."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {key.upper(): value for key, value in carrier.items() if key in _CONTEXT_KEYS}


def gateway_trace_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What the gateway needs to join the trace: the context and the OTEL_* export settings."""
    passed = {name: environ[name] for name in _PASSED_ON if name in environ}
    return passed | trace_environment()
