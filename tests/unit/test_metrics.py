from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import fakeredis
import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from redis import Redis

from tests.support.fake_redis import FakeRedisClients
from tests.support.redis_server import free_port
from worker import logs
from worker.metrics import (
    JobMetrics,
    apply_forwarded,
    apply_job_metrics,
    start_metrics_server,
    stop_metrics_server,
    sweep_job_metrics,
)
from worker.metrics._recorders import ForwardedMetrics, WorkerMetrics
from worker.redis_io import keys as redis_keys

CONTRACT = {
    ("agent_tasks", "counter", ("agent", "type", "outcome")),
    ("agent_llm_calls", "counter", ("provider", "model", "status")),
    ("agent_llm_tokens", "counter", ("model", "direction")),
    ("agent_cost_usd", "counter", ("agent",)),
    ("agent_tool_calls", "counter", ("server", "tool", "outcome")),
    ("agent_grant_denials", "counter", ("agent", "tool")),
    ("agent_errors_posted", "counter", ()),
    ("agent_outbox_dead_letters", "counter", ("kind",)),
    ("agent_hub_writes_refused", "counter", ("agent", "kind", "reason")),
    ("agent_jobs_undecodable", "counter", ()),
    ("agent_redis_unavailable", "counter", ("kind",)),
    ("agent_budget_check_unreachable", "counter", ("agent",)),
    ("agent_scope_refusals", "counter", ("agent", "tool")),
    ("agent_egress_refusals", "counter", ("agent", "tool")),
    ("agent_task_duration_seconds", "histogram", ("type",)),
    ("agent_loop_iterations", "histogram", ("type",)),
    ("agent_tool_call_duration_seconds", "histogram", ("server",)),
    ("agent_queue_jobs", "gauge", ("queue", "state")),
    ("agent_outbox_items", "gauge", ()),
    ("agent_memory_recalls", "counter", ("agent", "strategy")),
    ("agent_memory_recall_hits", "counter", ("agent",)),
    ("agent_memory_writes", "counter", ("agent", "kind")),
    ("agent_memory_evictions", "counter", ("agent",)),
    ("agent_memory_recall_duration_seconds", "histogram", ()),
    ("agent_memory_bytes", "gauge", ("agent",)),
}


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def redis(server: fakeredis.FakeServer, fake_redis: FakeRedisClients) -> fakeredis.FakeRedis:
    return fake_redis(server=server)


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.set_stream(stream)
    yield stream
    logs.set_stream(None)


def events(stream: io.StringIO, name: str) -> list[dict[str, object]]:
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [event for event in parsed if event["event"] == name]


def one_of_each(metrics: JobMetrics, *, cost_usd: float | None = 0.25) -> None:
    metrics.task_finished(
        agent="devops-agent",
        task_type="notification",
        outcome="completed",
        duration_s=12.5,
        iterations=3,
        cost_usd=cost_usd,
    )
    metrics.llm_call(
        provider="openai", model="gpt-test", status="ok", tokens_input=100, tokens_output=7
    )
    metrics.tool_call(server="hub", tool="search_posts", outcome="error", duration_s=0.3)
    metrics.grant_denied(agent="devops-agent", tool="hub__create_post")
    metrics.error_posted()
    metrics.dead_letter("consumption")
    metrics.write_refused(agent="devops-agent", kind="comment", reason="daily_limit")
    metrics.scope_refused(agent="devops-agent", tool="hub__create_post")
    metrics.egress_refused(agent="devops-agent", tool="web__fetch")
    metrics.budget_check_unreachable(agent="devops-agent")
    metrics.memory_recalled(agent="devops-agent", strategy="keyword", hits=2, duration_s=0.002)
    metrics.memory_written(agent="devops-agent", kinds=["conversation"], evicted=1)


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_every_contract_metric_has_its_name_type_and_labels(fake_redis: FakeRedisClients) -> None:
    metrics = WorkerMetrics()
    server = fakeredis.FakeServer()
    # One agent with a memory, so that agent_memory_bytes has a series to show its label.
    fake_redis(server=server).hset(redis_keys.MEMORY_BYTES, "devops-agent", 2048)
    metrics.watch_queues(lambda: fake_redis(server=server), ["agents"])
    recorded = JobMetrics()
    one_of_each(recorded)
    recorded.apply_locally(metrics)
    metrics.job_undecodable()
    metrics.redis_unavailable("oom")

    families = {
        (family.name, family.type, _label_names(family)) for family in metrics.registry.collect()
    }

    assert families == {(name, kind, tuple(sorted(labels))) for name, kind, labels in CONTRACT}


def _label_names(family: Metric) -> tuple[str, ...]:
    names = {label for sample in family.samples for label in sample.labels if label != "le"}
    return tuple(sorted(names))


def test_job_increments_reach_the_parent_through_redis(redis: fakeredis.FakeRedis) -> None:
    in_job = JobMetrics()
    one_of_each(in_job)
    assert in_job.flush(redis, "t-1")

    parent = WorkerMetrics()
    assert apply_job_metrics(redis, "t-1", metrics=parent)

    labels = {"agent": "devops-agent", "type": "notification", "outcome": "completed"}
    assert value(parent, "agent_tasks_total", **labels) == 1
    assert value(parent, "agent_cost_usd_total", agent="devops-agent") == 0.25
    assert value(parent, "agent_task_duration_seconds_sum", type="notification") == 12.5
    assert value(parent, "agent_loop_iterations_count", type="notification") == 1
    assert (
        value(parent, "agent_llm_calls_total", provider="openai", model="gpt-test", status="ok")
        == 1
    )
    assert value(parent, "agent_llm_tokens_total", model="gpt-test", direction="input") == 100
    assert value(parent, "agent_llm_tokens_total", model="gpt-test", direction="output") == 7
    tool = {"server": "hub", "tool": "search_posts", "outcome": "error"}
    assert value(parent, "agent_tool_calls_total", **tool) == 1
    assert value(parent, "agent_tool_call_duration_seconds_sum", server="hub") == 0.3
    grant = {"agent": "devops-agent", "tool": "hub__create_post"}
    assert value(parent, "agent_grant_denials_total", **grant) == 1
    # A job process's scope refusals reach the parent like every other increment.
    assert value(parent, "agent_scope_refusals_total", **grant) == 1
    assert value(parent, "agent_errors_posted_total") == 1
    assert redis.exists(redis_keys.job_metrics("t-1")) == 0
    assert redis.zcard(redis_keys.JOB_METRICS_PENDING) == 0


def test_metrics_are_applied_once(redis: fakeredis.FakeRedis) -> None:
    in_job = JobMetrics()
    one_of_each(in_job)
    in_job.flush(redis, "t-1")
    in_job.error_posted()
    in_job.flush(redis, "t-1")
    parent = WorkerMetrics()

    assert apply_job_metrics(redis, "t-1", metrics=parent)
    assert not apply_job_metrics(redis, "t-1", metrics=parent)
    assert value(parent, "agent_errors_posted_total") == 2
    assert value(parent, "agent_loop_iterations_count", type="notification") == 1


def test_unknown_cost_leaves_the_cost_counter_alone(redis: fakeredis.FakeRedis) -> None:
    in_job = JobMetrics()
    one_of_each(in_job, cost_usd=None)
    in_job.flush(redis, "t-1")
    parent = WorkerMetrics()
    apply_job_metrics(redis, "t-1", metrics=parent)

    assert value(parent, "agent_cost_usd_total", agent="devops-agent") is None
    labels = {"agent": "devops-agent", "type": "notification", "outcome": "completed"}
    assert value(parent, "agent_tasks_total", **labels) == 1


def test_failed_flush_keeps_the_buffer_for_the_next_one(
    server: fakeredis.FakeServer, redis: fakeredis.FakeRedis, log_lines: io.StringIO
) -> None:
    in_job = JobMetrics()
    in_job.error_posted()
    server.connected = False

    assert not in_job.flush(redis, "t-1")
    assert events(log_lines, "job_metrics_flush_failed")

    server.connected = True
    in_job.error_posted()
    assert in_job.flush(redis, "t-1")
    parent = WorkerMetrics()
    apply_job_metrics(redis, "t-1", metrics=parent)
    assert value(parent, "agent_errors_posted_total") == 2


def test_apply_locally_skips_redis() -> None:
    in_process = JobMetrics()
    one_of_each(in_process)
    metrics = WorkerMetrics()

    in_process.apply_locally(metrics)
    in_process.apply_locally(metrics)

    assert value(metrics, "agent_errors_posted_total") == 1


def test_sweep_applies_only_leftovers_older_than_the_cutoff(redis: fakeredis.FakeRedis) -> None:
    for job_id in ("orphan", "fresh"):
        in_job = JobMetrics()
        in_job.error_posted()
        in_job.flush(redis, job_id)
    redis.zadd(redis_keys.JOB_METRICS_PENDING, {"orphan": time.time() - 600})
    metrics = WorkerMetrics()

    assert sweep_job_metrics(redis, older_than_s=120, metrics=metrics) == 1

    assert value(metrics, "agent_errors_posted_total") == 1
    assert redis.zrange(redis_keys.JOB_METRICS_PENDING, 0, -1) == [b"fresh"]
    assert redis.exists(redis_keys.job_metrics("fresh")) == 1


def test_entries_outside_the_contract_are_skipped(
    redis: fakeredis.FakeRedis, log_lines: io.StringIO
) -> None:
    batch = {
        "counters": [
            ["agent_errors_posted_total", [], 1],
            ["agent_tasks_total", ["only-one-label"], 1],
            ["not_a_metric_total", [], 1],
            ["agent_errors_posted_total", [], -5],
            "garbage",
        ],
        "observations": [["agent_loop_iterations", ["exploration"], [2, "x"]]],
    }
    key = redis_keys.job_metrics("t-1")
    redis.rpush(key, json.dumps(batch), b"not json")
    metrics = WorkerMetrics()

    assert apply_job_metrics(redis, "t-1", metrics=metrics)

    assert value(metrics, "agent_errors_posted_total") == 1
    assert value(metrics, "agent_loop_iterations_count", type="exploration") == 1
    assert len(events(log_lines, "job_metrics_malformed")) == 1


def test_queue_and_outbox_gauges_are_read_at_scrape_time(redis: fakeredis.FakeRedis) -> None:
    metrics = WorkerMetrics()
    metrics.watch_queues(lambda: redis, ["agents"])
    redis.rpush("rq:queue:agents", "a", "b")
    redis.zadd("rq:scheduled:agents", {"c": 1})
    redis.zadd("rq:failed:agents", {"d": 1, "e": 2, "f": 3})
    redis.zadd("rq:wip:agents", {"g:exec": 1})
    redis.rpush(redis_keys.OUTBOX, "x", "y")

    assert value(metrics, "agent_queue_jobs", queue="agents", state="queued") == 2
    assert value(metrics, "agent_queue_jobs", queue="agents", state="scheduled") == 1
    assert value(metrics, "agent_queue_jobs", queue="agents", state="failed") == 3
    assert value(metrics, "agent_queue_jobs", queue="agents", state="started") == 1
    assert value(metrics, "agent_queue_jobs", queue="agents", state="finished") == 0
    assert value(metrics, "agent_outbox_items") == 2

    redis.delete(redis_keys.OUTBOX)
    redis.zadd(redis_keys.OUTBOX, {"x": 1, "y": 2, "z": 3})
    redis.lpop("rq:queue:agents")
    assert value(metrics, "agent_outbox_items") == 3
    assert value(metrics, "agent_queue_jobs", queue="agents", state="queued") == 1


def test_scrape_without_redis_still_answers(
    server: fakeredis.FakeServer, redis: fakeredis.FakeRedis, log_lines: io.StringIO
) -> None:
    metrics = WorkerMetrics()
    metrics.watch_queues(lambda: redis, ["agents"])
    server.connected = False

    text = generate_latest(metrics.registry).decode()

    assert "# TYPE agent_queue_jobs gauge" in text
    assert "agent_queue_jobs{" not in text
    assert events(log_lines, "metrics_redis_unavailable")


def test_each_label_set_is_one_series_without_a_created_twin() -> None:
    metrics = WorkerMetrics()
    recorded = JobMetrics()
    one_of_each(recorded)
    recorded.apply_locally(metrics)

    text = generate_latest(metrics.registry).decode()

    assert "_created" not in text
    tasks = [line for line in text.splitlines() if line.startswith("agent_tasks")]
    assert tasks == [
        'agent_tasks_total{agent="devops-agent",outcome="completed",type="notification"} 1.0'
    ]
    assert value(metrics, "agent_task_duration_seconds_count", type="notification") == 1


def test_exposition_passes_promtool(redis: fakeredis.FakeRedis) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package: prometheus)")
    metrics = WorkerMetrics()
    metrics.watch_queues(lambda: redis, ["agents"])
    in_process = JobMetrics()
    one_of_each(in_process)
    in_process.apply_locally(metrics)

    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(metrics.registry),
        capture_output=True,
        check=False,
    )

    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def stop_servers() -> Iterator[None]:
    yield
    stop_metrics_server()


@pytest.mark.usefixtures("stop_servers")
def test_server_answers_metrics_and_health(
    server: fakeredis.FakeServer, redis: fakeredis.FakeRedis
) -> None:
    metrics = WorkerMetrics()
    metrics.job_undecodable()
    port = start_metrics_server(free_port(), lambda: redis, host="127.0.0.1", metrics=metrics)
    assert port is not None
    base = f"http://127.0.0.1:{port}"

    status, body = get(f"{base}/metrics")
    assert status == 200
    assert "agent_jobs_undecodable_total 1.0" in body
    assert 'agent_queue_jobs{queue="agents",state="queued"} 0.0' in body
    assert get(f"{base}/healthz") == (200, "ok\n")
    assert get(f"{base}/elsewhere")[0] == 404

    server.connected = False
    assert get(f"{base}/healthz") == (503, "redis unreachable\n")


@pytest.mark.usefixtures("stop_servers")
def test_taken_port_moves_to_the_next_one(log_lines: io.StringIO) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]

        port = start_metrics_server(
            taken, fakeredis.FakeRedis, host="127.0.0.1", metrics=WorkerMetrics()
        )

    assert port is not None and taken < port <= taken + 16
    assert get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
    (moved,) = events(log_lines, "metrics_port_taken")
    assert (moved["wanted_port"], moved["port"]) == (taken, port)


def test_port_zero_disables_the_server() -> None:
    assert start_metrics_server(0, fakeredis.FakeRedis) is None


def test_real_redis_client_type_is_accepted(fake_redis: FakeRedisClients) -> None:
    # The factory contract is "returns a redis.Redis"; fakeredis is one.
    assert isinstance(fake_redis(), Redis)


def test_embeddings_tokens_count_as_input_tokens_of_the_embeddings_model(
    redis: fakeredis.FakeRedis,
) -> None:
    in_job = JobMetrics()
    in_job.embeddings_call(model="text-embedding-3-small", tokens=42)
    in_job.embeddings_call(model="text-embedding-3-small", tokens=8)
    in_job.flush(redis, "t-1")
    parent = WorkerMetrics()
    apply_job_metrics(redis, "t-1", metrics=parent)

    tokens = value(
        parent, "agent_llm_tokens_total", model="text-embedding-3-small", direction="input"
    )
    assert tokens == 50


def test_a_pooled_workers_metrics_reach_the_pools_registry_one_line_per_batch() -> None:
    sent: list[bytes] = []
    member = ForwardedMetrics(sent.append)
    pool = WorkerMetrics()

    member.redis_unavailable("oom")
    member.job_undecodable()
    job = JobMetrics()
    job.llm_call(provider="openai", model="m", status="ok", tokens_input=5, tokens_output=2)
    job.apply_locally(member)
    for line in sent:
        apply_forwarded(line, metrics=pool)

    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in sent)
    assert value(member, "agent_redis_unavailable_total", kind="oom") is None  # kept nothing
    assert value(pool, "agent_redis_unavailable_total", kind="oom") == 1
    assert value(pool, "agent_jobs_undecodable_total") == 1
    assert value(pool, "agent_llm_tokens_total", model="m", direction="input") == 5


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'{"counters": [["agent_jobs_undecodable", [], -5]]}\n',
        b'{"counters": [["agent_not_a_metric_total", [], 1]]}\n',
        b'{"counters": [["agent_redis_unavailable_total", ["a", "b"], 1]]}\n',
    ],
)
def test_a_forwarded_line_that_breaks_the_contract_changes_nothing(line: bytes) -> None:
    pool = WorkerMetrics()
    before = generate_latest(pool.registry)

    apply_forwarded(line, metrics=pool)

    assert generate_latest(pool.registry) == before
