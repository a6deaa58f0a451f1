"""Seeing the spans a test makes: in this process (``recorded_spans``), or over OTLP/HTTP
from other processes (``running_otlp_receiver``, from ``worker.dev.otlp_receiver``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from worker.dev.otlp_receiver import OtlpReceiver, ReceivedSpan, running_otlp_receiver
from worker.tracing import _setup

__all__ = [
    "CONTENT_ATTRIBUTES",
    "OtlpReceiver",
    "ReceivedSpan",
    "recorded_spans",
    "running_otlp_receiver",
]

# The GenAI attributes that carry message content: absent unless the operator opts in.
CONTENT_ATTRIBUTES = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
)


def _reset_global_provider() -> None:
    # What opentelemetry-test-utils' reset_trace_globals does: the API sets its provider
    # once per process, and each test wants its own.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def recorded_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Every span this process ends inside the block, kept in memory (the SDK's own exporter)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    monkeypatch.setattr(_setup, "_configured", True)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_global_provider()
