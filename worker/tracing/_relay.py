"""Spans of a forked job process, handed to the worker parent instead of exported by the job.

A job process is a fork of a worker whose tracer provider is ready: it inherits it, and
pays no SDK set-up. What it must not pay either is an export request of its own per task
(the batch processor cannot batch across tasks in a process that runs one task, and
``os._exit`` skips its flush). So the provider has one processor, ``JobSpanRelay``, which
routes each span by where it runs:

    worker process (and its job threads)  the SDK's batch processor: one export request
                                          per batch, across tasks
    forked job process, inside its job    the spans go to the job's Redis list in a few
                                          batches (one RPUSH each), each with the start
                                          records of the spans still open
    worker process, after the job         ``deliver_job_spans`` reads the list, ends the
                                          spans the job process never ended (killed: status
                                          ERROR, ``error.type`` ``job_process_lost``) and
                                          hands them all to the batch processor

Why Redis: the job's metrics already reach the parent that way (a list per job applied
after the job process exits), each batch lands whole and at once, so a killed job
process loses only the spans that ended since its last batch, and the open spans it
wrote can still be ended by the parent (the trace stays whole). A worker that dies
before delivering leaves the list to another worker's maintenance (``sweep_job_spans``),
as for metrics.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceState

from worker.logs import log_event
from worker.redis_io import keys as redis_keys
from worker.redis_io import take_job_list

# A job's list outlives a dead worker long enough for another worker's sweep.
JOB_SPANS_TTL_S = 86_400
# The ``error.type`` of a span its job process never ended (killed, crashed).
LOST_SPAN_ERROR = "job_process_lost"
# A job process writes its spans when one of these starts (a task waits there)...
_OPERATION = "gen_ai.operation.name"
_WAITS = frozenset({"chat", "execute_tool", "invoke_agent"})
# ... and when a span ends this long after the last write.
_WRITE_AFTER_S = 1.0


class _Redis(Protocol):
    def pipeline(self, transaction: bool = True) -> Any: ...

    def rpush(self, name: str, *values: str) -> Any: ...

    def zrangebyscore(
        self, name: str, min: float | str, max: float | str, start: int, num: int
    ) -> Any: ...


class _Processor(Protocol):
    def on_start(self, span: Any, parent_context: Context | None = None) -> None: ...

    def _on_ending(self, span: Any) -> None: ...

    def on_end(self, span: Any) -> None: ...

    def shutdown(self) -> None: ...

    def force_flush(self, timeout_millis: int = 30000) -> bool: ...


class _JobSink:
    """Where a forked job process writes its spans: the job's Redis list, in batches.

    A batch goes out where the task starts to wait (a model call, a tool call, a CLI run:
    the GenAI operations), at a span's end a second or more after the last one, and at the
    job's end: a few writes a task instead of one per span. Each batch carries the start
    records of the spans open then, so what a kill leaves behind is always a whole trace:
    the wait the kill interrupted is in it (ended by the worker as lost), and only spans
    that ended since the last batch are missing, with none of their descendants.
    """

    def __init__(self, redis: _Redis, job_id: str) -> None:
        self._redis = redis
        self._job_id = job_id
        self._unwritten_open: dict[int, Any] = {}  # open spans whose start record is not out
        self._ended: list[str] = []  # end records not yet written
        self._last_write = time.monotonic()
        self._written = False
        self._failed = False

    def started(self, span: Any) -> None:
        self._unwritten_open[span.context.span_id] = span
        if (span.attributes or {}).get(_OPERATION) in _WAITS:
            self.write()

    def ended(self, span: Any) -> None:
        self._unwritten_open.pop(span.context.span_id, None)
        self._ended.append(json.dumps(_record(span, ended=True)))
        if time.monotonic() - self._last_write >= _WRITE_AFTER_S:
            self.write()

    def write(self) -> None:
        """Write what is not out yet: start records of open spans, then the ended ones."""
        if not self._unwritten_open and not self._ended:
            return
        starts = [json.dumps(_record(s, ended=False)) for s in self._unwritten_open.values()]
        records = starts + self._ended
        # Written now: the worker ends them itself if no end record follows.
        self._unwritten_open.clear()
        self._ended = []
        self._last_write = time.monotonic()
        self._send(records)

    def _send(self, records: Sequence[str]) -> None:
        if self._failed:
            return
        key = redis_keys.job_spans(self._job_id)
        try:
            if self._written:
                self._redis.rpush(key, *records)  # one command: the list is already known
            else:
                with self._redis.pipeline(transaction=False) as pipe:
                    pipe.rpush(key, *records)
                    pipe.expire(key, JOB_SPANS_TTL_S)
                    pipe.zadd(redis_keys.JOB_SPANS_PENDING, {self._job_id: time.time()}, nx=True)
                    pipe.execute()
                self._written = True
        except Exception as exc:  # spans are a side step: the task goes on without them
            self._failed = True
            log_event(
                "trace_relay_failed", "warning", job_id=self._job_id, error=type(exc).__name__
            )


class JobSpanRelay:
    """The provider's span processor: the batch processor here, the job's list in a job process."""

    def __init__(self, inner: _Processor) -> None:
        self._inner = inner
        self._pid = os.getpid()
        self._sink: _JobSink | None = None

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        if self._sink is not None:
            self._sink.started(span)
        else:
            self._inner.on_start(span, parent_context)

    def _on_ending(self, span: Any) -> None:
        if self._sink is None:
            self._inner._on_ending(span)

    def on_end(self, span: Any) -> None:
        if self._sink is not None:
            self._sink.ended(span)
        else:
            self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)

    @contextmanager
    def job_process(self, redis: _Redis, job_id: str) -> Iterator[None]:
        """Inside a forked job process, write the job's spans to its list (else: nothing)."""
        if os.getpid() == self._pid:
            yield  # a job thread or an in-process run: the batch processor has them
            return
        self._sink = _JobSink(redis, job_id)
        try:
            yield
        finally:
            self._sink.write()
            self._sink = None

    def deliver(self, redis: _Redis, job_id: str) -> int:
        """Hand the spans a job process wrote to the batch processor; returns how many."""
        raw_records = take_job_list(
            redis, redis_keys.job_spans(job_id), redis_keys.JOB_SPANS_PENDING, job_id
        )
        spans = _spans_from_records(raw_records, job_id)
        for span in spans:
            self._inner.on_end(span)
        return len(spans)


_relay_lock = threading.Lock()
_relay: JobSpanRelay | None = None


def install_relay(inner: _Processor) -> JobSpanRelay:
    """The relay around ``inner`` (the batch processors), for this process's provider."""
    global _relay
    with _relay_lock:
        _relay = JobSpanRelay(inner)
        return _relay


@contextmanager
def relaying_job_spans(redis: Any, job_id: str) -> Iterator[None]:
    """Around a job's run: in a forked job process its spans go to the parent via Redis."""
    if _relay is None or redis is None:
        yield
        return
    with _relay.job_process(redis, job_id):
        yield


def deliver_job_spans(redis: Any, job_id: str) -> int:
    """In the worker, after a job: export what its job process handed over (0 when off)."""
    if _relay is None:
        return 0
    try:
        return _relay.deliver(redis, job_id)
    except Exception as exc:  # a trace must not stop the worker
        log_event("trace_delivery_failed", "warning", job_id=job_id, error=type(exc).__name__)
        return 0


def sweep_job_spans(redis: Any, *, older_than_s: float, limit: int = 100) -> int:
    """Deliver the spans of jobs whose worker died before delivering them; returns how many."""
    if _relay is None:
        return 0
    stale = redis.zrangebyscore(
        redis_keys.JOB_SPANS_PENDING, "-inf", time.time() - older_than_s, start=0, num=limit
    )
    delivered = 0
    for raw_id in stale:
        job_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        delivered += deliver_job_spans(redis, job_id)
    return delivered


# --- records: a span as JSON, and back ----------------------------------------------------


def _context_fields(context: SpanContext) -> list[Any]:
    return [
        format(context.trace_id, "032x"),
        format(context.span_id, "016x"),
        int(context.trace_flags),
        context.trace_state.to_header(),
        context.is_remote,
    ]


def _record(span: Any, *, ended: bool) -> dict[str, Any]:
    scope = span.instrumentation_scope
    record: dict[str, Any] = {
        "name": span.name,
        "context": _context_fields(span.context),
        "parent": _context_fields(span.parent) if span.parent is not None else None,
        "kind": span.kind.value,
        "start": span.start_time,
        "attributes": dict(span.attributes or {}),
        "links": [
            [_context_fields(link.context), dict(link.attributes or {})] for link in span.links
        ],
        "scope": [scope.name, scope.version, scope.schema_url] if scope is not None else None,
    }
    if ended:
        record["end"] = span.end_time
        record["events"] = [
            [event.name, event.timestamp, dict(event.attributes or {})] for event in span.events
        ]
        record["status"] = [span.status.status_code.value, span.status.description]
    return record


def _span_context(fields: Sequence[Any]) -> SpanContext:
    trace_id, span_id, flags, state, remote = fields
    return SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=bool(remote),
        trace_flags=trace.TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else TraceState(),
    )


def _spans_from_records(raw_records: Sequence[bytes | str], job_id: str) -> list[Any]:
    """The ended spans, and the open ones ended now as lost, in the order they started."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    provider: Any = trace.get_tracer_provider()
    resource = getattr(provider, "resource", None)
    by_id: dict[str, dict[str, Any]] = {}
    for raw in raw_records:
        try:
            record = json.loads(raw)
            span_id = record["context"][1]
        except (ValueError, KeyError, IndexError, TypeError):
            log_event("job_spans_malformed", "warning", job_id=job_id)
            continue
        if "end" in record or span_id not in by_id:
            by_id[span_id] = record
    spans = []
    lost_at = time.time_ns()
    for record in by_id.values():
        ended = "end" in record
        attributes: dict[str, Any] = record["attributes"]
        status = Status(StatusCode(record["status"][0]), record["status"][1]) if ended else None
        if not ended:
            attributes = attributes | {"error.type": LOST_SPAN_ERROR}
            status = Status(StatusCode.ERROR, LOST_SPAN_ERROR)
        scope = record["scope"]
        spans.append(
            ReadableSpan(
                name=record["name"],
                context=_span_context(record["context"]),
                parent=_span_context(record["parent"]) if record["parent"] else None,
                resource=resource,
                attributes=_attributes(attributes),
                events=[
                    Event(name, _attributes(event_attributes), timestamp)
                    for name, timestamp, event_attributes in record.get("events", [])
                ],
                links=[
                    Link(_span_context(context), _attributes(link_attributes))
                    for context, link_attributes in record["links"]
                ],
                kind=SpanKind(record["kind"]),
                status=status or Status(StatusCode.UNSET),
                start_time=record["start"],
                end_time=record["end"] if ended else max(lost_at, record["start"]),
                instrumentation_scope=InstrumentationScope(*scope) if scope else None,
            )
        )
    return spans


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    # JSON turned the SDK's tuples into lists; the exporters take either, the API wants tuples.
    return {
        key: tuple(value) if isinstance(value, list) else value for key, value in values.items()
    }
