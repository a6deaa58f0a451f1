"""The spans each part of the worker makes, read from the SDK's in-memory exporter.

Each test goes through the part's own entry point (``enqueue_task``, rq's job function,
a provider model's ``complete``, the tool dispatcher, an httpx2 client, a process's
``TRACEPARENT``, ``agent-worker report``, the log lines). The whole trace across real
processes is tests/integration/test_tracing.py.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import anyio
import fakeredis
import httpx2
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.support.fake_clis import install_fake_cli, read_record
from tests.support.fake_redis import FakeRedisClients
from tests.support.redis_server import free_port
from tests.support.tracing import CONTENT_ATTRIBUTES, recorded_spans
from worker import logs
from worker.enqueue import enqueue_task
from worker.exceptions import ConfigurationError
from worker.loop import EventBus, ToolDispatcher
from worker.metrics import JobMetrics, apply_job_metrics
from worker.metrics._recorders import WorkerMetrics
from worker.metrics._server import start_server, stop_servers
from worker.models import Message, ModelRequest, ModelResponse, StopReason, ToolCall, Usage
from worker.models._fallback import FallbackModel
from worker.models._retry import AttemptFailed, RetryingModel, RetryPolicy
from worker.operations._reports import StoredReport, render_report
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool
from worker.tracing import (
    TracingTransport,
    _content,
    _setup,
    attached,
    environment_context,
    trace_environment,
    traced_agent_run,
)
from worker.tracing._content import CAPTURE_VARIABLE
from worker.tracing._queue import processing

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"
CANARY = "sk-ant-canary0123456789abcdefghij"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    with recorded_spans(monkeypatch) as exporter:
        yield exporter


@pytest.fixture
def capture_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(CAPTURE_VARIABLE, "SPAN_ONLY")
    _content.capture_content.cache_clear()
    yield
    _content.capture_content.cache_clear()


@pytest.fixture(autouse=True)
def _capture_read_afresh() -> Iterator[None]:
    _content.capture_content.cache_clear()
    yield
    _content.capture_content.cache_clear()


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def parent_id(span: ReadableSpan) -> str | None:
    return format(span.parent.span_id, "016x") if span.parent is not None else None


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


# --- configuration -------------------------------------------------------------------------


def test_without_an_exporter_asked_for_tracing_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(_setup, "_configured", None)
    assert _setup.configure_tracing("agent-worker") is False
    assert not _setup.tracing_enabled()


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "zipkin"},
            "OTEL_TRACES_EXPORTER 'zipkin' needs the span exporter 'zipkin', which is not "
            "installed",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "x",
            },
            "OTEL_EXPORTER_OTLP_PROTOCOL 'x' is not one of grpc, http/protobuf",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "x",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL 'x' is not one of grpc, http/protobuf",
        ),
        (
            # The variable that chose the missing exporter, and the package that has it.
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            "OTEL_EXPORTER_OTLP_PROTOCOL 'grpc' needs the span exporter 'otlp_proto_grpc' "
            "(package opentelemetry-exporter-otlp-proto-grpc), which is not installed",
        ),
    ],
)
def test_an_exporter_nothing_provides_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_setup, "_configured", None)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        _setup.configure_tracing("agent-worker")


def test_the_standard_variables_alone_turn_the_sdk_on_with_the_process_service_name() -> None:
    # A fresh interpreter: the API's global provider is set once per process.
    probe = (
        "from worker.tracing import configure_tracing, flush_spans\n"
        "from worker.tracing._setup import tracer\n"
        "assert configure_tracing('mcp-hub')\n"
        "with tracer().start_as_current_span('probe'): pass\n"
        "flush_spans(5)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "deployment=test"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    exported = json.loads(done.stdout)
    assert exported["name"] == "probe"
    assert exported["resource"]["attributes"]["service.name"] == "mcp-hub"
    assert exported["resource"]["attributes"]["deployment"] == "test"


# --- across the queue ----------------------------------------------------------------------


def task(task_id: str = "t-1", **changes: Any) -> dict[str, Any]:
    return {"task_id": task_id, "type": "exploration", "agent_id": "agent-a", **changes}


def job_task(redis: fakeredis.FakeRedis, task_id: str) -> dict[str, Any]:
    data = redis.hget(f"rq:job:{task_id}", "data")
    assert isinstance(data, bytes)
    call = json.loads(zlib.decompress(data))
    wire: dict[str, Any] = call[2][0]
    return wire


def test_enqueue_writes_its_publish_span_as_the_tasks_creation_context(
    spans: InMemorySpanExporter,
    redis: fakeredis.FakeRedis,
) -> None:
    tracer = trace.get_tracer("producer")
    with tracer.start_as_current_span("hub handles a mention") as hub_span:
        enqueue_task(redis, task())
    publish = named(spans, "publish agents")
    assert publish.kind is SpanKind.PRODUCER
    assert parent_id(publish) == format(hub_span.get_span_context().span_id, "016x")
    assert publish.attributes is not None
    assert publish.attributes["messaging.destination.name"] == "agents"
    assert publish.attributes["messaging.message.id"] == "t-1"
    trace_id, span_id = hex_ids(publish)
    assert job_task(redis, "t-1")["traceparent"].startswith(f"00-{trace_id}-{span_id}-")


def test_a_producers_own_context_rides_untouched(
    spans: InMemorySpanExporter, redis: fakeredis.FakeRedis
) -> None:
    enqueue_task(redis, task(traceparent=TRACEPARENT, tracestate="hub=1"))
    assert spans.get_finished_spans() == ()
    wire = job_task(redis, "t-1")
    assert (wire["traceparent"], wire["tracestate"]) == (TRACEPARENT, "hub=1")


@pytest.mark.parametrize("bad", ["00-short-00f067aa0ba902b7-01", "not a traceparent"])
def test_a_malformed_traceparent_is_an_invalid_task(bad: str, fake_redis: FakeRedisClients) -> None:
    with pytest.raises(Exception, match="traceparent"):
        enqueue_task(fake_redis(), task(traceparent=bad))


@dataclass
class FakeJob:
    id: str
    meta: dict[str, Any] = field(default_factory=dict)
    origin: str = "agents"
    connection: Any = None


def test_the_first_run_continues_the_producers_trace_and_a_rerun_links_to_it(
    spans: InMemorySpanExporter,
    redis: fakeredis.FakeRedis,
) -> None:
    wire = task(traceparent=TRACEPARENT)
    first_job, rerun_job = FakeJob("t-1"), FakeJob("t-1")
    with processing(first_job, wire, redis):
        pass
    with processing(rerun_job, wire, redis):  # a crash re-run: the same job again
        pass
    first, rerun = spans.get_finished_spans()
    assert (first.name, first.kind) == ("process agents", SpanKind.CONSUMER)
    assert hex_ids(first)[0] == PRODUCER_TRACE
    assert parent_id(first) == PRODUCER_SPAN
    assert first.attributes is not None
    assert first.attributes["agent_worker.task.attempt"] == 0
    assert first.attributes["messaging.message.id"] == "t-1"
    assert hex_ids(rerun)[0] != PRODUCER_TRACE and rerun.parent is None
    assert [
        (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
        for link in rerun.links
    ] == [(PRODUCER_TRACE, PRODUCER_SPAN)]
    # agent-worker report names the trace each run was in.
    assert first_job.meta["trace_id"] == PRODUCER_TRACE
    assert rerun_job.meta["trace_id"] == hex_ids(rerun)[0]


def test_a_requeued_attempt_is_a_new_linked_trace(spans: InMemorySpanExporter) -> None:
    with processing(FakeJob("t-1", meta={"attempt": 1}), task(traceparent=TRACEPARENT), None):
        pass
    (span,) = spans.get_finished_spans()
    assert span.parent is None and hex_ids(span)[0] != PRODUCER_TRACE
    assert len(span.links) == 1
    assert span.attributes is not None and span.attributes["agent_worker.task.attempt"] == 1


def test_a_task_that_crashes_still_ends_and_exports_its_span(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), processing(FakeJob("t-1"), task(), None):
        raise RuntimeError("the job broke")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR


def test_a_crash_is_recorded_by_its_class_without_its_message_or_stack(
    spans: InMemorySpanExporter,
) -> None:
    with pytest.raises(RuntimeError), processing(FakeJob("t-1"), task(), None):
        raise RuntimeError(f"provider said: invalid api key {CANARY}")

    (span,) = spans.get_finished_spans()
    assert span.status.description == "RuntimeError"
    assert span.attributes is not None and span.attributes["error.type"] == "RuntimeError"
    assert span.events == ()  # no ``exception`` event: its message and stack quote too much


@pytest.mark.anyio
async def test_an_oversized_agent_id_never_becomes_a_span_name(
    spans: InMemorySpanExporter,
) -> None:
    @traced_agent_run
    async def run(raw: Any, runtime: Any) -> Any:
        raise RuntimeError("stop here")

    hostile = {"task_id": "t-1", "agent_id": "a" * 129, "type": "notification"}
    with pytest.raises(RuntimeError):
        await run(hostile, None)

    (span,) = spans.get_finished_spans()
    assert span.name == "invoke_agent"
    assert span.attributes is not None and "gen_ai.agent.name" not in span.attributes
    assert span.attributes["gen_ai.conversation.id"] == "t-1"


# --- the agent run --------------------------------------------------------------------------


class FlakyModel(RetryingModel):
    """One 503, then an answer: the retry layer's real path, no network."""

    provider_name: ClassVar[str] = "openai"

    def __init__(self) -> None:
        super().__init__(
            "gpt-test",
            default_timeout_s=5,
            retry=RetryPolicy(max_retries=2, base_delay_s=0.0, jitter=False),
            prices=None,
        )
        self.attempts = 0

    async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
        self.attempts += 1
        if self.attempts == 1:
            raise AttemptFailed("overloaded", status=503)
        return ModelResponse(
            text=f"Done; my key is {CANARY}",
            stop_reason=StopReason.END_TURN,
            usage=Usage(input_tokens=120, output_tokens=15, cost_usd=0.0042, cache_read_tokens=100),
            provider="openai",
            model="gpt-test-0613",
        )


def chat_request() -> ModelRequest:
    return ModelRequest(
        system="You are a careful agent.",
        messages=[Message(role="user", content=f"Please summarise. Secret: {CANARY}")],
        max_output_tokens=256,
        temperature=0.2,
    )


@pytest.mark.anyio
async def test_a_model_call_is_one_chat_span_with_usage_cost_and_its_retry(
    spans: InMemorySpanExporter,
) -> None:
    await FlakyModel().complete(chat_request())
    chat = named(spans, "chat gpt-test")
    assert chat.kind is SpanKind.CLIENT
    attributes = dict(chat.attributes or {})
    finish_reasons = attributes.pop("gen_ai.response.finish_reasons")
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.response.model": "gpt-test-0613",
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 15,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.cache_creation.input_tokens": 0,
        "agent_worker.llm.attempts": 2,
        "agent_worker.usage.cost_usd": 0.0042,
    }
    assert tuple(finish_reasons) == ("stop",)
    (retry,) = chat.events
    assert retry.name == "agent_worker.retry"
    assert retry.attributes is not None and retry.attributes["error.type"] == "503"
    assert not CONTENT_ATTRIBUTES & set(attributes)  # no content unless the operator opts in


@pytest.mark.anyio
@pytest.mark.usefixtures("capture_on")
async def test_captured_content_is_redacted_and_capped(spans: InMemorySpanExporter) -> None:
    request = chat_request()
    request.messages = [*request.messages, Message(role="user", content="x" * 10_000)]
    await FlakyModel().complete(request)
    attributes = named(spans, "chat gpt-test").attributes or {}
    captured = " ".join(str(attributes[key]) for key in CONTENT_ATTRIBUTES & set(attributes))
    assert "Please summarise" in captured and "Done; my key is" in captured
    assert CANARY not in captured and "[REDACTED]" in captured
    inputs = json.loads(str(attributes["gen_ai.input.messages"]))
    long_text = inputs[1]["parts"][0]["content"]
    assert len(long_text) == _content.CONTENT_MAX_CHARS
    assert long_text.endswith(_content.TRUNCATED_MARK)


def dispatcher() -> ToolDispatcher:
    toolbox = LocalToolbox(
        [
            LocalTool(name="echo", function=lambda text: f"echo {text}"),
            LocalTool(name="admin", function=lambda: "x", required_grant="admin:write"),
        ],
        grants=set(),
    )
    return ToolDispatcher(
        toolbox,
        task_id="t-1",
        agent_id="agent-a",
        events=EventBus(),
        max_output_chars=1000,
    )


@pytest.mark.anyio
async def test_each_tool_call_is_an_execute_tool_span_with_its_outcome(
    spans: InMemorySpanExporter,
) -> None:
    tools = dispatcher()
    await tools.run(1, 1, ToolCall(id="c1", name="echo", arguments=json.dumps({"text": CANARY})), 5)
    await tools.run(1, 2, ToolCall(id="c2", name="admin", arguments="{}"), 5)
    echo, admin = spans.get_finished_spans()
    assert echo.name == "execute_tool echo"
    assert dict(echo.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "agent_worker.tool.outcome": "ok",
        "agent_worker.tool.server": "local",
    }
    assert admin.status.status_code is trace.StatusCode.ERROR
    assert (admin.attributes or {})["error.type"] == "missing_grant"


@pytest.mark.anyio
@pytest.mark.usefixtures("capture_on")
async def test_captured_tool_arguments_and_results_are_redacted(
    spans: InMemorySpanExporter,
) -> None:
    await dispatcher().run(
        1, 1, ToolCall(id="c1", name="echo", arguments=json.dumps({"text": CANARY})), 5
    )
    attributes = named(spans, "execute_tool echo").attributes or {}
    assert "[REDACTED]" in str(attributes["gen_ai.tool.call.arguments"])
    assert str(attributes["gen_ai.tool.call.result"]) == "echo [REDACTED]"


@pytest.mark.anyio
async def test_a_fallback_after_a_failed_model_is_a_sibling_chat_span(
    spans: InMemorySpanExporter,
) -> None:
    class Down(FlakyModel):
        async def _request_once(self, request: ModelRequest, timeout_s: float) -> ModelResponse:
            raise AttemptFailed("overloaded", status=529)

    down = Down()
    down._model = "gpt-down"
    with trace.get_tracer("t").start_as_current_span("step") as step:
        await FallbackModel([down, FlakyModel()]).complete(chat_request())
    failed, answered = (s for s in spans.get_finished_spans() if s.name.startswith("chat "))
    assert (failed.name, answered.name) == ("chat gpt-down", "chat gpt-test")
    step_id = format(step.get_span_context().span_id, "016x")
    assert parent_id(failed) == parent_id(answered) == step_id
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "model_unavailable"
    assert len(failed.events) == 2  # its two retries, before the fallback took over


@pytest.mark.anyio
async def test_a_cli_run_is_one_span_and_hands_its_traceparent_to_the_cli_and_gateway(
    spans: InMemorySpanExporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.cli_runs import (
        executor,
        make_agent,
        make_request,
        make_settings,
        mcp_config_file,
    )

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer collector-secret")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = install_fake_cli("claude", bin_dir)
    settings = make_settings(mcp_config=mcp_config_file(tmp_path))
    agent = make_agent("claude-code", grants=["kit:read"])
    # The worker starts the task's gateway itself: note the environment it is given.
    gateway_envs: list[dict[str, str]] = []
    open_process = anyio.open_process

    async def noting_open_process(command: Any, **options: Any) -> Any:
        if "mcp_servers.gateway" in command:
            gateway_envs.append(dict(options["env"]))
        return await open_process(command, **options)

    monkeypatch.setattr(anyio, "open_process", noting_open_process)
    await executor("claude-code", fake).run(make_request(agent, worker_settings=settings))
    record = read_record(fake)

    span = named(spans, "invoke_agent claude-code")
    assert span.kind is SpanKind.CLIENT
    assert (span.attributes or {})["agent_worker.agent"] == "cli-agent"
    trace_id, span_id = hex_ids(span)
    assert record["env"]["TRACEPARENT"].startswith(f"00-{trace_id}-{span_id}-")
    (gateway_env,) = gateway_envs
    assert gateway_env["TRACEPARENT"] == record["env"]["TRACEPARENT"]
    assert gateway_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert "collector-secret" not in json.dumps(record)  # the collector's credentials stay
    assert "collector-secret" not in json.dumps(gateway_env)


# --- context handed over, and HTTP ---------------------------------------------------------


def test_a_process_continues_the_traceparent_of_its_environment(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway a CLI started, and agent-worker enqueue called by a producer, do this.
    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    with (
        attached(environment_context()),
        trace.get_tracer("t").start_as_current_span("tools/call hub__get_thread"),
    ):
        pass
    span = named(spans, "tools/call hub__get_thread")
    assert (hex_ids(span)[0], parent_id(span)) == (PRODUCER_TRACE, PRODUCER_SPAN)


@pytest.mark.anyio
async def test_a_hub_call_is_a_client_span_and_carries_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(201, json={"id": "c-1"})

    transport = TracingTransport(httpx2.MockTransport(answer))
    async with httpx2.AsyncClient(transport=transport) as client:
        await client.post("http://hub.test:8100/api/v1/posts/p-1/comments?q=secret", json={})
    span = named(spans, "POST")
    trace_id, span_id = hex_ids(span)
    assert seen[0].headers["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    assert span.kind is SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "http.request.method": "POST",
        "server.address": "hub.test",
        "server.port": 8100,
        "url.scheme": "http",
        "url.full": "http://hub.test:8100/api/v1/posts/p-1/comments",
        "http.response.status_code": 201,
    }


# --- logs and the report --------------------------------------------------------------------


def test_log_lines_inside_a_span_name_it_and_others_do_not(spans: InMemorySpanExporter) -> None:
    stream = io.StringIO()
    logs.set_stream(stream)
    try:
        logs.log_event("outside")
        with trace.get_tracer("t").start_as_current_span("inside") as span:
            logs.log_event("within")
    finally:
        logs.set_stream(None)
    outside, within = (json.loads(line) for line in stream.getvalue().splitlines())
    assert "trace_id" not in outside and "span_id" not in outside
    context = span.get_span_context()
    assert (within["trace_id"], within["span_id"]) == (
        format(context.trace_id, "032x"),
        format(context.span_id, "016x"),
    )


def test_a_tasks_duration_carries_its_trace_as_an_exemplar_on_the_metrics_endpoint(
    spans: InMemorySpanExporter,
    redis: fakeredis.FakeRedis,
) -> None:
    in_job, parent = JobMetrics(), WorkerMetrics()
    with trace.get_tracer("t").start_as_current_span("invoke_agent agent-a") as span:
        in_job.task_finished(
            agent="agent-a",
            task_type="notification",
            outcome="completed",
            duration_s=2.5,
            iterations=1,
            cost_usd=None,
        )
    in_job.flush(redis, "t-1")  # from the job process to the worker parent, through Redis
    apply_job_metrics(redis, "t-1", metrics=parent)
    port = start_server(
        free_port(), host="127.0.0.1", registry=parent.registry, redis_factory=lambda: redis
    )
    assert port is not None
    try:
        scrape = httpx2.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            timeout=10,
        )
        plain = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    finally:
        stop_servers()
    trace_id = format(span.get_span_context().trace_id, "032x")
    (bucket,) = [
        line
        for line in scrape.text.splitlines()
        if line.startswith("agent_task_duration_seconds_bucket") and "# {" in line
    ]
    assert f'# {{trace_id="{trace_id}"}} 2.5' in bucket
    assert "trace_id" not in plain.text  # the classic text format has no exemplars


def test_the_report_names_the_trace_of_its_run() -> None:
    report = {"task_id": "t-1", "outcome": "completed", "output": "Done."}
    shown = render_report(
        StoredReport(report=report, job_status="finished", ended_at=None, trace_id=PRODUCER_TRACE)
    )
    assert f"  trace: {PRODUCER_TRACE}" in shown.splitlines()


def test_traceparent_reaches_a_child_process_environment_only_inside_a_span(
    spans: InMemorySpanExporter,
) -> None:
    assert trace_environment() == {}
    carrier = {"traceparent": TRACEPARENT}
    with trace.get_tracer("t").start_as_current_span("cli", context=propagate.extract(carrier)):
        assert trace_environment()["TRACEPARENT"].startswith(f"00-{PRODUCER_TRACE}-")
