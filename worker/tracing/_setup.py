"""Turning traces on: the SDK's tracer provider, configured only by the standard OTEL_* variables.

The OpenTelemetry API is always installed and costs nothing while no SDK is set up; the
SDK and the OTLP exporter come with the ``tracing`` extra. A process exports traces when
the SDK is installed, ``OTEL_SDK_DISABLED`` is not true, and the operator asked for an
exporter: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, any registered exporter; ``none``
turns traces off) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). The sampler (``OTEL_TRACES_SAMPLER[_ARG]``),
resource (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``), batching (``OTEL_BSP_*``),
attribute limits and the exporter's endpoint, headers and timeout are the SDK's own
reading of the environment. ``otlp`` follows ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``,
``http/protobuf`` by default as the specification says.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from worker._signals import signals_left_to_the_main_thread
from worker.exceptions import ConfigurationError
from worker.logs import log_event
from worker.tracing._relay import install_relay

TRACER_NAME = "hub-agent-worker"
_EXPORTER_GROUP = "opentelemetry_traces_exporter"
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
# The signal's own variable first, as the specification orders them.
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_EXPORTER_PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
}
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_lock = threading.Lock()
_configured: bool | None = None
_tracer: tuple[trace.TracerProvider, trace.Tracer] | None = None


def configure_tracing(default_service_name: str) -> bool:
    """Export this process's spans as the OTEL_* variables say; True when traces are on.

    Call once at a process's start (the worker parent, an MCP server, the enqueue CLI);
    later calls return the first answer. ``default_service_name`` is ``service.name``
    unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` name one. Raises
    ConfigurationError for an exporter or protocol nothing installed provides.
    """
    global _configured
    with _lock:
        if _configured is None:
            _configured = _install(default_service_name)
        return _configured


def tracer() -> trace.Tracer:
    """The project's tracer from the current provider (a no-op one until the SDK is set up)."""
    global _tracer
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(TRACER_NAME))
    return _tracer[1]


@contextmanager
def span(name: str, **options: Any) -> Iterator[trace.Span]:
    """The project's way to start a current span (``options``: the API's ``kind``,
    ``attributes``, ``context``, ``links``). An exception leaving it is recorded by its
    class or code only: its message may quote a provider's answer or a secret, so neither
    the status description nor an ``exception`` event (message, stack, paths) carries it."""
    with tracer().start_as_current_span(
        name, record_exception=False, set_status_on_exception=False, **options
    ) as current:
        try:
            yield current
        except BaseException as exc:
            _record_error(current, exc)
            raise


def _record_error(current: trace.Span, exc: BaseException) -> None:
    """The error's class or code on ``current``, never its message."""
    if current.is_recording():
        current.set_attribute("error.type", str(getattr(exc, "code", type(exc).__qualname__)))
        current.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def spans_off() -> bool:
    """True while no tracer provider is installed: every span would be a no-op that only
    passes its parent's context on, so the per-step decorators skip making one."""
    return isinstance(trace.get_tracer_provider(), _NO_OP_PROVIDERS)


_NO_OP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def sampled_trace_id() -> str | None:
    """The trace id of the current span when it is recorded (an exporter will have it)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    return format(span.get_span_context().trace_id, "032x")


def tracing_enabled() -> bool:
    """Whether this process exports spans (``configure_tracing`` succeeded)."""
    return bool(_configured)


def flush_spans(timeout_s: float) -> None:
    """Export the spans still buffered, waiting at most ``timeout_s``: before a process
    ends (``os._exit`` skips the SDK's own flush). A failing exporter is logged, never raised."""
    if not _configured:
        return
    provider: Any = trace.get_tracer_provider()
    try:
        done = provider.force_flush(int(timeout_s * 1000))
    except Exception as exc:  # an exporter's trouble must not fail the task
        log_event("trace_flush_failed", "warning", error=f"{type(exc).__name__}: {exc}")
        return
    if done is False:
        log_event("trace_flush_incomplete", "warning", timeout_s=timeout_s)


def _install(default_service_name: str) -> bool:
    names = _exporter_names()
    if not names or _is_true(os.environ.get("OTEL_SDK_DISABLED")):
        return False
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log_event(
            "tracing_unavailable",
            "warning",
            reason="OTEL_* variables ask for traces but opentelemetry-sdk is not installed "
            "(install the 'tracing' extra)",
        )
        return False
    exporters = [_exporter_class(name)() for name in names]
    named_by_environment = SERVICE_NAME in OTELResourceDetector().detect().attributes
    resource = Resource.create({} if named_by_environment else {SERVICE_NAME: default_service_name})
    provider = TracerProvider(resource=resource)
    batches = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    for exporter in exporters:
        with signals_left_to_the_main_thread():  # the batch processor's thread
            batches.add_span_processor(BatchSpanProcessor(exporter))
    # Forked job processes hand their spans to this process, which batches across tasks;
    # the relay has the SpanProcessor interface without needing the SDK to import.
    relay: Any = install_relay(batches)
    provider.add_span_processor(relay)
    trace.set_tracer_provider(provider)
    log_event(
        "tracing_enabled",
        service=str(resource.attributes.get(SERVICE_NAME)),
        exporters=names,
    )
    return True


def _exporter_names() -> list[str]:
    requested = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not requested:
        # No exporter named: an OTLP endpoint alone is asking for OTLP.
        return ["otlp"] if any(os.environ.get(name) for name in _ENDPOINT_VARIABLES) else []
    names = [name.strip() for name in requested.split(",") if name.strip()]
    return [] if names == ["none"] else names


def _exporter_class(name: str) -> Any:
    """The span exporter ``name`` stands for; a missing one is named with the variable that
    chose it (the protocol's for otlp) and the package that brings it."""
    entry_name, chosen_by = name, f"OTEL_TRACES_EXPORTER {name!r}"
    if name == "otlp":
        variable = next((v for v in _PROTOCOL_VARIABLES if os.environ.get(v, "").strip()), None)
        protocol = os.environ[variable].strip() if variable else "http/protobuf"
        if protocol not in _OTLP_BY_PROTOCOL:
            raise ConfigurationError(
                f"{variable} {protocol!r} is not one of {', '.join(sorted(_OTLP_BY_PROTOCOL))}"
            )
        entry_name = _OTLP_BY_PROTOCOL[protocol]
        if variable is not None:
            chosen_by = f"{variable} {protocol!r}"
    found = list(entry_points(group=_EXPORTER_GROUP, name=entry_name))
    if not found:
        installed = sorted(entry.name for entry in entry_points(group=_EXPORTER_GROUP))
        package = _EXPORTER_PACKAGES.get(entry_name)
        raise ConfigurationError(
            f"{chosen_by} needs the span exporter {entry_name!r}"
            + (f" (package {package})" if package else "")
            + f", which is not installed (installed: {', '.join(installed) or 'none'})"
        )
    return found[0].load()


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"
