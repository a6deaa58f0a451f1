"""A task's trace across the queue, as the OpenTelemetry messaging conventions draw it.

Producer: the task's ``traceparent``/``tracestate`` (W3C) are its creation context. A
producer that sets them keeps them untouched; otherwise ``enqueue_task`` starts a
PRODUCER span ``publish agents`` (child of whatever span is current) and writes its
context into the task.

Consumer: each run of the job is a CONSUMER span ``process agents`` (job id, attempt,
queue). The first delivery of a creation context continues the producer's trace as its
child; a re-run of the same job (crash re-run, requeue after an outage, a busy agent)
starts a new trace linked to it, so one trace is one run. "First" is decided once across
the fleet by a Redis key per creation context, written only while traces are on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol, TypeVar, cast

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind

from worker.redis_io import keys as redis_keys
from worker.task import raw_field
from worker.tracing._relay import relaying_job_spans
from worker.tracing._setup import span, tracing_enabled

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MESSAGING_SYSTEM = "rq"
# A re-run can come days later (rq keeps a job for its result TTL): the key outlives it.
_DELIVERY_KEY_TTL_S = 8 * 86_400


class _Job(Protocol):
    id: str
    origin: str
    meta: dict[str, Any]
    connection: Any


JobFunction = TypeVar("JobFunction", bound=Callable[..., Any])


class _Redis(Protocol):
    def set(self, name: str, value: str, *, nx: bool, ex: int) -> Any: ...


def creation_context(task: Mapping[str, Any]) -> Context | None:
    """The producer's context carried by a task (a wire dict), or None when it has none."""
    carrier = {
        key: value for key in (TRACEPARENT, TRACESTATE) if isinstance(value := task.get(key), str)
    }
    if TRACEPARENT not in carrier:
        return None
    context = propagate.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


@contextmanager
def publishing(task_wire: dict[str, Any], queue_name: str) -> Iterator[None]:
    """Around one enqueue: give ``task_wire`` a creation context unless it carries one."""
    if TRACEPARENT in task_wire:
        yield
        return
    with span(
        f"publish {queue_name}",
        kind=SpanKind.PRODUCER,
        attributes=_messaging("publish", queue_name, task_wire.get("task_id")),
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        for key in (TRACEPARENT, TRACESTATE):
            if key in carrier:
                task_wire[key] = carrier[key]
        yield


def traced_job(run: JobFunction) -> JobFunction:
    """Decorates the rq job function: each run is one ``processing`` span of rq's current job,
    named from the task, its first argument; the rest pass through untouched."""

    @functools.wraps(run)
    def traced(task: Any, *args: Any, **kwargs: Any) -> Any:
        from rq import get_current_job  # rq only where a job runs

        job: Any = get_current_job()
        with processing(job, task, job.connection if job is not None else None):
            return run(task, *args, **kwargs)

    return cast(JobFunction, traced)


@contextmanager
def processing(job: _Job | None, task: Any, redis: _Redis | None) -> Iterator[None]:
    """The CONSUMER span of one run of a task's job. In a forked job process its spans
    go to the worker through Redis (``_relay``): the job process sends no export request.

    Records the trace id in ``job.meta["trace_id"]`` (saved with the report) while the
    span is sampled, so ``agent-worker report`` can name the trace.
    """
    wire = task if isinstance(task, Mapping) else {}
    queue = job.origin if job is not None else "agents"
    attempt = _attempt(job)
    created = creation_context(wire)
    parent: Context = Context()  # never whatever context the worker thread had
    links: list[Link] = []
    delivery = "new"
    if created is not None:
        if attempt == 0 and _first_delivery(created, redis):
            parent, delivery = created, "first"
        else:
            links.append(Link(trace.get_current_span(created).get_span_context()))
            delivery = "redelivery"
    message_id = job.id if job is not None else raw_field(task, "task_id")
    attributes = _messaging("process", queue, message_id)
    attributes |= {"agent_worker.task.attempt": attempt, "agent_worker.delivery": delivery}
    relay = relaying_job_spans(redis, job.id) if job is not None else nullcontext()
    with (
        relay,
        span(
            f"process {queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ) as current,
    ):
        if job is not None:
            _note_trace_id(job, current)
        yield


def _first_delivery(created: Context, redis: _Redis | None) -> bool:
    """True for the one run that continues the producer's trace (decided fleet-wide)."""
    if redis is None or not tracing_enabled():
        return True
    span_context = trace.get_current_span(created).get_span_context()
    key = redis_keys.trace_delivery(
        format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")
    )
    try:
        return bool(redis.set(key, "1", nx=True, ex=_DELIVERY_KEY_TTL_S))
    except Exception:  # Redis trouble must not stop the task: a linked trace is still whole
        return False


def _note_trace_id(job: _Job, span: trace.Span) -> None:
    if span.is_recording():
        job.meta["trace_id"] = format(span.get_span_context().trace_id, "032x")
    else:
        job.meta.pop("trace_id", None)  # only a run of ours names the trace


def _attempt(job: _Job | None) -> int:
    attempt = (job.meta or {}).get("attempt", 0) if job is not None else 0
    return attempt if isinstance(attempt, int) else 0


def _messaging(operation: str, queue: str, message_id: object) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": queue,
    }
    if isinstance(message_id, str):
        attributes["messaging.message.id"] = message_id
    return attributes
