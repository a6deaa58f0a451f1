"""A forked job process hands its spans to the worker through Redis (``worker.tracing._relay``).

The job process here is a real ``os.fork`` of the test, as rq's is of the worker, and the
list lives in the session's real redis-server (fakeredis is not shared across a fork).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from redis import Redis

from tests.support.redis_server import RedisServer
from worker.redis_io import keys as redis_keys
from worker.tracing._relay import LOST_SPAN_ERROR, JobSpanRelay


@pytest.fixture
def redis(redis_server: RedisServer) -> Iterator[Redis]:
    client = Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def relay(exported: InMemorySpanExporter) -> JobSpanRelay:
    return JobSpanRelay(SimpleSpanProcessor(exported))


@pytest.fixture
def tracer(relay: JobSpanRelay) -> Tracer:
    provider = TracerProvider()
    provider.add_span_processor(relay)
    return provider.get_tracer("relay-test")


def run_in_job_process(relay: JobSpanRelay, redis: Redis, job_id: str, tracer: Tracer) -> int:
    """Fork; the child runs a task's spans under the relay and is killed inside its model
    call, as a job process can be. Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the job process: it must never return into pytest
        try:
            with (
                relay.job_process(redis, job_id),
                tracer.start_as_current_span("process agents", kind=SpanKind.CONSUMER),
                tracer.start_as_current_span(
                    "invoke_agent bot", attributes=operation("invoke_agent")
                ),
            ):
                with tracer.start_as_current_span(
                    "chat bot",
                    kind=SpanKind.CLIENT,
                    attributes=operation("chat")
                    | {"gen_ai.usage.input_tokens": 12, "finish": ("stop",)},
                ) as chat:
                    chat.add_event("agent_worker.retry", {"agent_worker.retry.attempt": 1})
                with (
                    tracer.start_as_current_span(
                        "execute_tool hub__get_thread", attributes=operation("execute_tool")
                    ),
                    tracer.start_as_current_span("GET", kind=SpanKind.CLIENT),
                ):
                    pass
                with tracer.start_as_current_span("chat again", attributes=operation("chat")):
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-call
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return status


def operation(name: str) -> dict[str, str]:
    """What marks a GenAI span (the conventions' operation name): where a task waits."""
    return {"gen_ai.operation.name": name}


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def test_a_killed_job_process_leaves_its_worker_a_whole_trace(
    relay: JobSpanRelay, redis: Redis, tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    status = run_in_job_process(relay, redis, "job-1", tracer)

    assert os.WIFSIGNALED(status)
    assert exported.get_finished_spans() == ()  # the job process exported nothing itself

    delivered = relay.deliver(redis, "job-1")

    spans = by_name(exported.get_finished_spans())
    assert delivered == 6
    assert set(spans) == {
        "process agents",
        "invoke_agent bot",
        "chat bot",
        "execute_tool hub__get_thread",
        "GET",
        "chat again",
    }
    # What ended in the job process arrives as it ended there.
    chat = spans["chat bot"]
    assert chat.kind is SpanKind.CLIENT
    assert chat.attributes == operation("chat") | {
        "gen_ai.usage.input_tokens": 12,
        "finish": ("stop",),
    }
    assert [(e.name, dict(e.attributes or {})) for e in chat.events] == [
        ("agent_worker.retry", {"agent_worker.retry.attempt": 1})
    ]
    assert chat.status.status_code is StatusCode.UNSET
    # Every parent is in the trace: the spans the kill left open are ended by the worker.
    ids = {span.context.span_id for span in spans.values()}
    for name in ("chat bot", "execute_tool hub__get_thread", "chat again"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == spans["invoke_agent bot"].context.span_id
    assert spans["GET"].parent is not None
    assert spans["GET"].parent.span_id == spans["execute_tool hub__get_thread"].context.span_id
    assert spans["invoke_agent bot"].parent is not None
    assert spans["invoke_agent bot"].parent.span_id in ids
    # The call the kill interrupted was written as it started: it arrives, ended as lost.
    for name in ("process agents", "invoke_agent bot", "chat again"):
        lost = spans[name]
        assert lost.status.status_code is StatusCode.ERROR
        assert lost.attributes is not None
        assert lost.attributes["error.type"] == LOST_SPAN_ERROR
        assert lost.end_time is not None and lost.start_time is not None
        assert lost.end_time >= lost.start_time
    assert len({span.context.trace_id for span in spans.values()}) == 1
    # Delivered once: the list and its pending mark are gone.
    assert redis.exists(redis_keys.job_spans("job-1")) == 0
    assert redis.zscore(redis_keys.JOB_SPANS_PENDING, "job-1") is None
    assert relay.deliver(redis, "job-1") == 0


def test_spans_of_the_worker_process_itself_go_straight_to_its_exporter(
    relay: JobSpanRelay, redis: Redis, tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    with relay.job_process(redis, "job-2"), tracer.start_as_current_span("process agents"):
        pass  # a job thread of the concurrent worker, or an in-process run

    assert [span.name for span in exported.get_finished_spans()] == ["process agents"]
    assert redis.exists(redis_keys.job_spans("job-2")) == 0


def test_a_malformed_record_is_skipped_and_the_rest_delivered(
    relay: JobSpanRelay, redis: Redis, tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    run_in_job_process(relay, redis, "job-3", tracer)
    redis.lpush(redis_keys.job_spans("job-3"), "not json", '{"context": 7}')

    assert relay.deliver(redis, "job-3") == 6


def rpush_calls(redis: Redis) -> int:
    return int(redis.info("commandstats").get("cmdstat_rpush", {}).get("calls", 0))


def test_a_job_process_writes_its_spans_where_the_task_waits_not_once_a_span(
    relay: JobSpanRelay, redis: Redis, tracer: Tracer, exported: InMemorySpanExporter
) -> None:
    before = rpush_calls(redis)
    pid = os.fork()
    if pid == 0:
        try:
            with (
                relay.job_process(redis, "job-4"),
                tracer.start_as_current_span("process agents", kind=SpanKind.CONSUMER),
                tracer.start_as_current_span(
                    "invoke_agent bot", attributes=operation("invoke_agent")
                ),
            ):
                for step in range(2):
                    with tracer.start_as_current_span(f"chat {step}", attributes=operation("chat")):
                        for request in range(3):
                            with tracer.start_as_current_span(f"POST {step}.{request}"):
                                pass
            os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0

    assert relay.deliver(redis, "job-4") == 10
    assert len(exported.get_finished_spans()) == 10
    # Where a wait starts (invoke_agent, each chat) and at the end: 4, not 10.
    assert rpush_calls(redis) - before <= 4
