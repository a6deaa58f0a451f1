"""``/metrics`` scrape time after 10 jobs and after 10,000, in the worker parent's process.

Each simulated job records what a real one does into a ``JobMetrics`` (one task,
three LLM calls, two tool calls, now and then a grant denial or an error post),
flushes it to Redis, and the parent applies it with ``apply_job_metrics``, as
after every real job. Labels vary as in a small fleet: 20 agents, two task
types, outcomes, four models, three servers with their tools. Each job also
lands in rq's finished registry, so the queue gauges read at scrape time count
registries as large as the jobs run. Scrapes are timed two ways:
``generate_latest`` on the registry, and HTTP GETs of the endpoint
``start_metrics_server`` serves (which also reads the queue gauges from Redis).

Two series of rows. "as they come": a fresh worker, whose first jobs have not
yet met most label sets (agent x type x outcome alone is 200 series here), so
its scrape grows until every label set has been seen. "all seen first": one
batch touching every label set of this fleet is applied before the jobs, so the
rows compare equal label sets and show what jobs run add by themselves.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import httpx2
import redis
from prometheus_client import generate_latest
from rq.registry import FinishedJobRegistry

from bench._report import Summary, Table
from bench._size import Size
from worker.dev.devstack import free_port, start_redis
from worker.metrics import JobMetrics, apply_job_metrics, start_metrics_server, stop_metrics_server
from worker.metrics._recorders import WorkerMetrics

CHECKPOINTS = (10, 1_000, 10_000, 20_000)
SCRAPES = 50
AGENTS = [f"agent-{index:02d}" for index in range(20)]
TASK_TYPES = ("notification", "exploration")
OUTCOMES = ("completed",) * 90 + ("max_iterations",) * 4 + ("tool_loop", "error", "budget")
MODELS = (
    ("openai", "gpt-4o-mini"),
    ("openai", "gpt-4.1"),
    ("anthropic", "claude-haiku-4-5"),
    ("anthropic", "claude-sonnet-4-5"),
)
TOOLS = {
    "hub": ("hub__search_posts", "hub__get_thread", "hub__create_comment", "hub__create_post"),
    "web": ("web__fetch",),
    "time": ("time__get_current_time",),
}
TOOL_OUTCOMES = ("ok",) * 18 + ("error", "timeout")
LLM_STATUSES = ("ok",) * 49 + ("rate_limited",)
DENIED_TOOL = "hub__create_post"
ERROR_OUTCOMES = ("tool_loop", "error")


def _record_job(metrics: JobMetrics, rng: random.Random) -> None:
    agent = rng.choice(AGENTS)
    task_type = rng.choice(TASK_TYPES)
    provider, model = rng.choice(MODELS)
    for _ in range(3):
        metrics.llm_call(
            provider=provider,
            model=model,
            status=rng.choice(LLM_STATUSES),
            tokens_input=rng.randint(500, 5000),
            tokens_output=rng.randint(20, 400),
        )
    for _ in range(2):
        server = rng.choice(list(TOOLS))
        metrics.tool_call(
            server=server,
            tool=rng.choice(TOOLS[server]),
            outcome=rng.choice(TOOL_OUTCOMES),
            duration_s=rng.uniform(0.01, 2.0),
        )
    if rng.random() < 0.02:
        metrics.grant_denied(agent=agent, tool=DENIED_TOOL)
    outcome = rng.choice(OUTCOMES)
    if outcome in ERROR_OUTCOMES:
        metrics.error_posted()
    metrics.task_finished(
        agent=agent,
        task_type=task_type,
        outcome=outcome,
        duration_s=rng.uniform(1, 120),
        iterations=rng.randint(1, 10),
        cost_usd=rng.uniform(0, 0.05),
    )


def _cover_label_sets(metrics: JobMetrics) -> None:
    """Record every label set the simulated fleet can produce once."""
    for agent in AGENTS:
        metrics.grant_denied(agent=agent, tool=DENIED_TOOL)
        for task_type in TASK_TYPES:
            for outcome in sorted(set(OUTCOMES)):
                metrics.task_finished(
                    agent=agent,
                    task_type=task_type,
                    outcome=outcome,
                    duration_s=10.0,
                    iterations=3,
                    cost_usd=0.01,
                )
    for provider, model in MODELS:
        for status in sorted(set(LLM_STATUSES)):
            metrics.llm_call(
                provider=provider, model=model, status=status, tokens_input=1, tokens_output=1
            )
    for server, tools in TOOLS.items():
        for tool in tools:
            for outcome in sorted(set(TOOL_OUTCOMES)):
                metrics.tool_call(server=server, tool=tool, outcome=outcome, duration_s=0.1)
    metrics.error_posted()


def _scrape_times(target: WorkerMetrics, url: str, scrapes: int) -> tuple[list[float], list[float]]:
    """CPU ms of ``generate_latest`` and wall ms of HTTP scrapes (after one of each as warm-up).

    The machine is shared: CPU time of the rendering thread, and the fastest HTTP
    scrapes, are what other load disturbs least.
    """
    generate_latest(target.registry)
    generated = []
    for _ in range(scrapes):
        started = time.thread_time()
        generate_latest(target.registry)
        generated.append((time.thread_time() - started) * 1000)
    scraped = []
    with httpx2.Client(timeout=10.0) as client:
        client.get(url).raise_for_status()
        for _ in range(scrapes):
            started = time.perf_counter()
            client.get(url).raise_for_status()
            scraped.append((time.perf_counter() - started) * 1000)
    return generated, scraped


def _series(target: WorkerMetrics) -> int:
    return sum(len(family.samples) for family in target.registry.collect())


@dataclass
class _Scraped:
    """One row: the exposition's size and the two scrape times after ``jobs`` jobs."""

    jobs: int
    samples: int
    body_kb: float
    generate: Summary
    http: Summary


def _run_series(
    connection: redis.Redis, checkpoints: Sequence[int], scrapes: int, *, cover_first: bool
) -> tuple[list[_Scraped], list[float]]:
    """Apply simulated jobs in a fresh worker's metrics; scrape at each checkpoint."""
    connection.flushdb()
    rng = random.Random(7)
    target = WorkerMetrics()
    if cover_first:
        covering = JobMetrics()
        _cover_label_sets(covering)
        covering.apply_locally(target)
    port = start_metrics_server(
        free_port(),
        lambda: redis.Redis(connection_pool=connection.connection_pool),
        host="127.0.0.1",
        metrics=target,
    )
    assert port is not None, "a free port was just picked"
    finished_registry = FinishedJobRegistry.key_template.format("agents")
    rows, apply_ms = [], []
    try:
        applied = 0
        for checkpoint in checkpoints:
            while applied < checkpoint:
                job_id = f"bench-metrics-{applied}"
                metrics = JobMetrics()
                _record_job(metrics, rng)
                metrics.flush(connection, job_id)
                connection.zadd(finished_registry, {job_id: time.time()})
                begun = time.perf_counter()
                apply_job_metrics(connection, job_id, metrics=target)
                apply_ms.append((time.perf_counter() - begun) * 1000)
                applied += 1
            generated, scraped = _scrape_times(target, f"http://127.0.0.1:{port}/metrics", scrapes)
            body_kb = len(generate_latest(target.registry)) / 1024
            rows.append(
                _Scraped(
                    checkpoint, _series(target), body_kb, Summary.of(generated), Summary.of(scraped)
                )
            )
    finally:
        stop_metrics_server()
    return rows, apply_ms


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    checkpoints = size.pick(full=CHECKPOINTS, quick=CHECKPOINTS[:3], smoke=CHECKPOINTS[:1])
    scrapes = size.pick(full=SCRAPES, quick=10, smoke=1)
    table = Table(
        "metrics scrape: /metrics after N jobs applied in the worker parent",
        [
            "label sets",
            "jobs",
            "samples",
            "body KB",
            "generate_latest CPU ms",
            "min-max",
            "HTTP scrape ms",
            "min-max",
            "vs 10 jobs: CPU",
            "HTTP best",
        ],
    )
    with ExitStack() as stack:
        connection = redis.Redis.from_url(start_redis(stack))
        stack.callback(connection.close)
        apply_ms: list[float] = []
        for label, cover_first in (("as they come", False), ("all seen first", True)):
            rows, applying = _run_series(connection, checkpoints, scrapes, cover_first=cover_first)
            apply_ms += applying
            for row in rows:
                table.add(
                    label,
                    f"{row.jobs:,}",
                    row.samples,
                    f"{row.body_kb:.1f}",
                    *row.generate.cells(2),
                    *row.http.cells(2),
                    f"{row.generate.median / rows[0].generate.median:.2f}x",
                    f"{row.http.low / rows[0].http.low:.2f}x",
                )
    table.notes = [
        f"{scrapes} scrapes per row after one warm-up; samples: lines of the exposition; vs 10 "
        "jobs: over the first row of its series, generate_latest by median CPU time, HTTP by",
        "  the fastest scrape (wall time; the Redis gauges are read in each).",
        f"applying one job's metrics in the parent: median {statistics.median(apply_ms):.2f} ms "
        "(one Redis transaction + counter updates).",
        "target: the scrape after 10,000 jobs within 2x of the one after 10. Scrape time follows",
        "  the number of series (label sets seen so far, bounded by the label caps), not the",
        "  number of jobs applied: compare the 'all seen first' rows for what jobs add.",
    ]
    return [table]
