"""One trace from the producer's enqueue to the Hub's reply, exported over OTLP/HTTP.

Every part is the real one: ``agent-worker enqueue`` with a producer's ``TRACEPARENT``,
``rq worker agents`` (burst), the devhub, mcp-hub over streamable HTTP, mcp-web over
stdio (started by the worker from ``MCP_CONFIG``), the scripted model endpoint. Each
process exports its spans to an OTLP/HTTP receiver running in this test, which decodes
them with the official protobuf definitions; only the standard OTEL_* variables
configure any of it. The test reads the tree back: producer → publish → process →
invoke_agent → chat / execute_tool → MCP server span → its Hub or fetch call.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.e2e import AGENT_WORKER, E2E, task_events
from tests.support.redis_server import RedisServer
from tests.support.tracing import (
    CONTENT_ATTRIBUTES,
    OtlpReceiver,
    ReceivedSpan,
    running_otlp_receiver,
)
from tests.support.workers import wait_until
from worker.dev.devstack import DevStack, running_stack
from worker.redis_io import keys as redis_keys

pytestmark = pytest.mark.integration

AGENT = "e2e-tracer"
CANARY = "sk-ant-canary" + "0123456789abcdefghij"
MARKER = "purple-otter-marker"
SPANS_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with running_otlp_receiver() as started:
        yield started


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, receiver: OtlpReceiver) -> Iterator[DevStack]:
    # Every process started from here on (the stack's servers, the CLI, the worker)
    # reads these, as an operator's deployment would set them.
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith("OTEL_") or name in ("TRACEPARENT", "TRACESTATE"):
                env.delenv(name)
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.setenv("OTEL_TRACES_SAMPLER", "always_on")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        with running_stack(redis_url=redis_server.url, scripted_llm=True) as started:
            yield started


@pytest.fixture
def e2e(stack: DevStack, receiver: OtlpReceiver) -> Iterator[E2E]:
    receiver.clear()
    with E2E.on(stack) as session:
        yield session


def mcp_config(stack: DevStack, receiver: OtlpReceiver, directory: Path) -> Path:
    """The stack's mcp-hub over HTTP, and mcp-web over stdio, started for each task."""
    hub_url = yaml.safe_load(stack.mcp_config.read_text())["servers"]["hub"]["url"]
    web_env = {
        "MCP_WEB_ALLOW_NETWORKS": "127.0.0.0/8",
        "CAPABILITY_KEY": stack.capability_key,
        # A stdio server gets only its env block: tracing is configured there too.
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    config = {
        "servers": {
            "hub": {
                "url": hub_url,
                "first_party": True,
                "tools": {"get_thread": "hub:read", "create_comment": "hub:write"},
            },
            "web": {
                "command": sys.executable,
                "args": ["-m", "mcp_servers.web", "--stdio"],
                "env": web_env,
                "first_party": True,
                "tools": {"fetch": "web:read"},
            },
        }
    }
    path = directory / "mcp.yaml"  # JSON is YAML
    path.write_text(json.dumps(config))
    return path


def enqueue_under_producer_trace(e2e: E2E, post_id: str) -> tuple[str, str, str]:
    """``agent-worker enqueue`` a mention of the agent under a producer's TRACEPARENT;
    returns the task id, the producer's trace id and its span id."""
    task_id = "traced-" + secrets.token_hex(4)
    trace_id, producer_span = secrets.token_hex(16), secrets.token_hex(8)
    task = {"task_id": task_id, "type": "notification", "agent_id": AGENT, "post_id": post_id}
    env = e2e.worker_env(TRACEPARENT=f"00-{trace_id}-{producer_span}-01")
    enqueued = subprocess.run(
        [AGENT_WORKER, "enqueue", "-"],
        input=json.dumps(task),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    return task_id, trace_id, producer_span


def run_traced_task(
    e2e: E2E, receiver: OtlpReceiver, tmp_path: Path, **worker_env: str
) -> tuple[str, str, str, list[ReceivedSpan]]:
    """Seed a mention, enqueue it under a producer's trace, run a burst worker; returns
    the task id, the producer's trace and span ids, and the spans of that trace."""
    post = e2e.hub.create_post(
        agent_id="alice", content=f"Hey @{AGENT}, {MARKER}: my key is {CANARY}, is that ok?"
    )
    post_id = str(post["id"])
    page = f"{e2e.stack.llm_base_url}/_scripted/stats"
    e2e.llm.set_scenario(
        AGENT,
        [
            {
                "tool_calls": [
                    {"name": "hub__get_thread", "arguments": {"post_id": post_id}},
                    {"name": "web__fetch", "arguments": {"url": page}},
                ],
                "usage": {"input_tokens": 120, "output_tokens": 15},
            },
            {
                "text": f"Never share it. ({MARKER})",
                "usage": {"input_tokens": 180, "output_tokens": 40},
            },
        ],
    )
    task_id, trace_id, producer_span = enqueue_under_producer_trace(e2e, post_id)
    config = mcp_config(e2e.stack, receiver, tmp_path)
    run = e2e.run_burst(MCP_CONFIG=str(config), **worker_env)
    assert run.returncode == 0, run.stderr
    assert e2e.report(task_id)["outcome"] == "completed", run.stderr
    (completed,) = task_events(run.stderr, "task_completed", task_id)
    assert completed["trace_id"] == trace_id  # the log line joins the trace

    expected = {
        "publish agents",
        "process agents",
        f"invoke_agent {AGENT}",
        "tools/call get_thread",
        "tools/call fetch",
        "execute_tool hub__get_thread",
        "execute_tool web__fetch",
    }

    def arrived() -> list[ReceivedSpan] | None:
        spans = receiver.spans(trace_id)
        names = {span.name for span in spans}
        chats = sum(1 for span in spans if span.name == f"chat {AGENT}")
        return spans if expected <= names and chats == 2 else None

    spans = wait_until(arrived, SPANS_TIMEOUT_S, "every process's spans of the task's trace")
    return task_id, trace_id, producer_span, spans


def one(spans: list[ReceivedSpan], name: str, service: str | None = None) -> ReceivedSpan:
    (span,) = [s for s in spans if s.name == name and (service is None or s.service == service)]
    return span


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


def tree(spans: list[ReceivedSpan]) -> str:
    """The trace as an indented outline, for a failing assertion's message."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_parent.setdefault(span.parent_span_id, []).append(span)
    known = {span.span_id for span in spans}
    lines: list[str] = []

    def walk(span: ReceivedSpan, depth: int) -> None:
        lines.append(f"{'  ' * depth}{span.name} [{span.service} {span.kind}]")
        for child in by_parent.get(span.span_id, []):
            walk(child, depth + 1)

    for root in [span for span in spans if span.parent_span_id not in known]:
        walk(root, 0)
    return "\n".join(lines)


def test_one_trace_from_the_producer_through_the_worker_and_mcp_to_the_hub(
    e2e: E2E, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    task_id, trace_id, producer_span, spans = run_traced_task(e2e, receiver, tmp_path)

    publish = one(spans, "publish agents")
    assert (publish.service, publish.kind) == ("agent-worker-enqueue", "SPAN_KIND_PRODUCER")
    assert publish.parent_span_id == producer_span

    process = one(spans, "process agents")
    assert (process.service, process.kind) == ("agent-worker", "SPAN_KIND_CONSUMER")
    assert process.parent_span_id == publish.span_id
    assert process.attributes["messaging.message.id"] == task_id
    assert process.attributes["messaging.destination.name"] == "agents"
    assert process.attributes["agent_worker.task.attempt"] == 0

    agent = one(spans, f"invoke_agent {AGENT}")
    assert agent.parent_span_id == process.span_id, tree(spans)
    assert agent.attributes["gen_ai.agent.name"] == AGENT
    assert agent.attributes["gen_ai.conversation.id"] == task_id
    assert agent.attributes["agent_worker.outcome"] == "completed"
    assert (
        agent.attributes["gen_ai.usage.input_tokens"],
        agent.attributes["gen_ai.usage.output_tokens"],
    ) == (300, 55)

    chats = [span for span in children(spans, agent) if span.name == f"chat {AGENT}"]
    assert [
        (c.attributes["gen_ai.usage.input_tokens"], c.attributes["gen_ai.usage.output_tokens"])
        for c in sorted(chats, key=lambda c: c.attributes["gen_ai.usage.input_tokens"])
    ] == [(120, 15), (180, 40)]
    assert {c.attributes["gen_ai.provider.name"] for c in chats} == {"openai"}
    assert sorted(c.attributes["gen_ai.response.finish_reasons"][0] for c in chats) == [
        "stop",
        "tool_call",
    ]

    # Each tool call: execute_tool in the worker → the mcp SDK's client span, which puts the
    # context in _meta → the server's span (mcp-hub over HTTP, mcp-web over stdio) → the
    # server's own call out (the Hub, a fetch).
    for tool, server, service in (
        ("get_thread", "hub", "mcp-hub"),
        ("fetch", "web", "mcp-web"),
    ):
        execute = one(spans, f"execute_tool {server}__{tool}")
        assert execute.parent_span_id == agent.span_id, tree(spans)
        assert execute.attributes["agent_worker.tool.server"] == server
        assert execute.attributes["agent_worker.tool.outcome"] == "ok"
        (sent,) = children(spans, execute)
        assert (sent.kind, sent.attributes["mcp.method.name"]) == ("SPAN_KIND_CLIENT", "tools/call")
        (served,) = children(spans, sent)
        assert (served.name, served.service, served.kind) == (
            f"tools/call {tool}",
            service,
            "SPAN_KIND_SERVER",
        )
        (outgoing,) = children(spans, served)
        assert (outgoing.name, outgoing.kind) == ("GET", "SPAN_KIND_CLIENT")
        assert outgoing.attributes["http.response.status_code"] == 200

    # The worker's own Hub calls (the thread, the reply) are client spans of the run.
    hub_calls = [s for s in spans if s.service == "agent-worker" and s.kind == "SPAN_KIND_CLIENT"]
    replies = [s for s in hub_calls if str(s.attributes.get("url.full", "")).endswith("/comments")]
    assert [reply.attributes["http.request.method"] for reply in replies] == ["POST"]

    # Safe by default: no message content, and nothing of the thread, in any span.
    for span in spans:
        assert not CONTENT_ATTRIBUTES & set(span.attributes), span.name
        assert MARKER not in json.dumps(span.attributes), span.name

    # The operator finds the trace from the task.
    shown = e2e.agent_worker_cli("report", task_id)
    assert f"trace: {trace_id}" in shown.stdout

    # One task, one trace: the worker's start (its providers' warm-up call, its MCP
    # initialize probing mcp-hub) left no trace of its own in any process.
    strays = [span for span in receiver.spans() if span.trace_id != trace_id]
    assert not strays, tree(strays)


def test_an_error_span_names_the_errors_class_never_the_providers_message(
    e2e: E2E, receiver: OtlpReceiver
) -> None:
    post = e2e.hub.create_post(agent_id="alice", content=f"Hey @{AGENT}, are you there?")
    refusal = f"invalid api key {CANARY} ({MARKER}) at /srv/secret/path.py"
    e2e.llm.set_scenario(AGENT, [{"status": 401, "error": {"message": refusal}}])
    task_id, trace_id, _ = enqueue_under_producer_trace(e2e, str(post["id"]))

    run = e2e.run_burst()

    assert run.returncode == 0, run.stderr
    assert e2e.report(task_id)["outcome"] == "model_error"

    def arrived() -> list[ReceivedSpan] | None:
        spans = receiver.spans(trace_id)
        names = {span.name for span in spans}
        return spans if {"process agents", f"chat {AGENT}"} <= names else None

    spans = wait_until(arrived, SPANS_TIMEOUT_S, "the failed task's spans")
    chat = one(spans, f"chat {AGENT}")
    assert chat.status_code == "STATUS_CODE_ERROR"
    assert chat.status_message == "ModelAuthError"
    assert chat.attributes["error.type"] == "model_auth_error"  # its code
    failed = [span for span in spans if span.status_code == "STATUS_CODE_ERROR"]
    assert {span.name for span in failed} >= {f"chat {AGENT}", f"invoke_agent {AGENT}"}
    for span in spans:
        # A class, a code or an outcome: one word, never the provider's text or a stack.
        assert span.status_message.isidentifier() or not span.status_message, span
        assert "exception" not in span.events, span.name
        shown = json.dumps([span.attributes, span.status_message])
        assert MARKER not in shown and "invalid api key" not in shown, span.name


def test_a_killed_job_process_still_leaves_a_whole_trace(
    e2e: E2E, receiver: OtlpReceiver, worker_mode: str
) -> None:
    if worker_mode == "concurrent":
        pytest.skip("a task in a job thread has no process of its own to kill")
    post = e2e.hub.create_post(agent_id="alice", content=f"Hey @{AGENT}, read this thread")
    post_id = str(post["id"])
    e2e.llm.set_scenario(
        AGENT,
        [
            {"tool_calls": [{"name": "hub__get_thread", "arguments": {"post_id": post_id}}]},
            {"text": "never sent", "delay_s": 300},  # killed while waiting for this one
        ],
    )
    task_id, trace_id, producer_span = enqueue_under_producer_trace(e2e, post_id)

    with e2e.worker() as worker:
        wait_until(lambda: len(e2e.llm.requests(AGENT)) >= 2 or None, 90, "the second model call")
        holder = e2e.redis.get(redis_keys.task_lease(task_id))
        assert isinstance(holder, bytes), worker.stderr
        job_process = int(holder.decode().rpartition(":")[2])
        os.kill(job_process, signal.SIGKILL)

        def arrived() -> list[ReceivedSpan] | None:
            spans = receiver.spans(trace_id)
            names = {span.name for span in spans}
            return spans if {"process agents", f"invoke_agent {AGENT}"} <= names else None

        spans = wait_until(arrived, SPANS_TIMEOUT_S, "the killed run's spans")

    # What ended before the kill arrived as it ended; what the kill left open was ended
    # by the worker, marked as lost; no span lost its parent.
    execute = one(spans, "execute_tool hub__get_thread")
    assert execute.attributes["agent_worker.tool.outcome"] == "ok"
    for name in ("process agents", f"invoke_agent {AGENT}"):
        lost = one(spans, name)
        assert lost.status_code == "STATUS_CODE_ERROR", name
        assert lost.attributes["error.type"] == "job_process_lost", name
    known = {span.span_id for span in spans} | {producer_span}
    assert all(span.parent_span_id in known for span in spans), tree(spans)


def test_spans_wait_in_the_worker_for_a_batch_and_leave_when_it_stops(
    e2e: E2E, receiver: OtlpReceiver
) -> None:
    post = e2e.hub.create_post(agent_id="alice", content=f"Hey @{AGENT}, one question")
    e2e.llm.set_scenario(AGENT, [{"text": "One answer."}])
    task_id, trace_id, _ = enqueue_under_producer_trace(e2e, str(post["id"]))

    # A batch leaves every ten minutes here: only a stopping worker sends it earlier.
    with e2e.worker(OTEL_BSP_SCHEDULE_DELAY="600000") as worker:
        wait_until(lambda: _outcome(e2e, task_id), 90, "the task's report")
        worker_spans = [s for s in receiver.spans(trace_id) if s.service == "agent-worker"]
        assert worker_spans == []  # the task did not export on its own
    assert worker.process.returncode == 0, worker.final_stderr

    names = {span.name for span in receiver.spans(trace_id) if span.service == "agent-worker"}
    assert {"process agents", f"invoke_agent {AGENT}", f"chat {AGENT}"} <= names


def _outcome(e2e: E2E, task_id: str) -> str | None:
    report = e2e.job(task_id).get_meta(refresh=True).get("report")
    return report.get("outcome") if isinstance(report, dict) else None


def test_captured_content_arrives_with_the_secret_redacted(
    e2e: E2E, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    _, _, _, spans = run_traced_task(
        e2e,
        receiver,
        tmp_path,
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY",
    )
    captured = json.dumps(
        [
            {key: value for key, value in span.attributes.items() if key in CONTENT_ATTRIBUTES}
            for span in spans
            if span.service == "agent-worker"
        ]
    )
    assert MARKER in captured  # the thread and the answer are there...
    assert CANARY not in json.dumps([span.attributes for span in spans])  # ...never the key
    assert "[REDACTED]" in captured
    thread_result = one(spans, "execute_tool hub__get_thread").attributes
    assert "[REDACTED]" in thread_result["gen_ai.tool.call.result"]
