"""``/metrics`` scrape time after 10 jobs and after 10,000, in the worker parent's process.

Each simulated job records what a real one does into a ``JobMetrics`` (one task,
three LLM calls, two tool calls, now and then a grant denial or an error post),
flushes it to Redis, and the parent applies it with ``apply_job_metrics``, as
after every real job. Labels vary as in a small fleet: 20 agents, two task
types, outcomes, four models, three servers with their tools. Scrapes are timed
two ways: ``generate_latest`` on the registry, and HTTP GETs of the endpoint
``start_metrics_server`` serves (which also reads the queue gauges from Redis).
"""

from __future__ import annotations

import random
import statistics
import time
from contextlib import ExitStack

import httpx2
import redis
from prometheus_client import generate_latest

from bench._report import Summary, Table
from worker.dev.devstack import free_port, start_redis
from worker.metrics import (
    JobMetrics,
    WorkerMetrics,
    apply_job_metrics,
    start_metrics_server,
    stop_metrics_server,
)

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


def _record_job(metrics: JobMetrics, rng: random.Random) -> None:
    agent = rng.choice(AGENTS)
    task_type = rng.choice(TASK_TYPES)
    provider, model = rng.choice(MODELS)
    for _ in range(3):
        metrics.llm_call(
            provider=provider,
            model=model,
            status="ok" if rng.random() < 0.98 else "rate_limited",
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
        metrics.grant_denied(agent=agent, tool="hub__create_post")
    outcome = rng.choice(OUTCOMES)
    if outcome in ("tool_loop", "error"):
        metrics.error_posted()
    metrics.task_finished(
        agent=agent,
        task_type=task_type,
        outcome=outcome,
        duration_s=rng.uniform(1, 120),
        iterations=rng.randint(1, 10),
        cost_usd=rng.uniform(0, 0.05),
    )


def _scrape_times(target: WorkerMetrics, url: str, scrapes: int) -> tuple[list[float], list[float]]:
    """Milliseconds of ``generate_latest`` and of HTTP scrapes (after one of each as warm-up)."""
    generate_latest(target.registry)
    generated = []
    for _ in range(scrapes):
        started = time.perf_counter()
        generate_latest(target.registry)
        generated.append((time.perf_counter() - started) * 1000)
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


def benchmark(*, quick: bool = False) -> list[Table]:
    checkpoints = CHECKPOINTS[:3] if quick else CHECKPOINTS
    scrapes = 10 if quick else SCRAPES
    rng = random.Random(7)
    target = WorkerMetrics()
    table = Table(
        "metrics scrape: /metrics after N jobs applied in the worker parent",
        [
            "jobs",
            "samples",
            "body KB",
            "generate_latest ms",
            "min-max",
            "HTTP scrape ms",
            "min-max",
            "vs 10 jobs",
            "ms per 100 samples",
        ],
    )
    with ExitStack() as stack:
        connection = redis.Redis.from_url(start_redis(stack))
        stack.callback(connection.close)
        port = free_port()
        started_port = start_metrics_server(
            port,
            lambda: redis.Redis(connection_pool=connection.connection_pool),
            host="127.0.0.1",
            metrics=target,
        )
        stack.callback(stop_metrics_server)
        url = f"http://127.0.0.1:{started_port}/metrics"
        applied = 0
        apply_ms: list[float] = []
        baseline: float | None = None
        for checkpoint in checkpoints:
            while applied < checkpoint:
                job_id = f"bench-metrics-{applied}"
                metrics = JobMetrics()
                _record_job(metrics, rng)
                metrics.flush(connection, job_id)
                begun = time.perf_counter()
                apply_job_metrics(connection, job_id, metrics=target)
                apply_ms.append((time.perf_counter() - begun) * 1000)
                applied += 1
            generated, scraped = _scrape_times(target, url, scrapes)
            generate = Summary.of(generated)
            http = Summary.of(scraped)
            baseline = baseline or http.median
            table.add(
                f"{checkpoint:,}",
                _series(target),
                f"{len(generate_latest(target.registry)) / 1024:.1f}",
                *generate.cells(2),
                *http.cells(2),
                f"{http.median / baseline:.2f}x",
                f"{generate.median / _series(target) * 100:.2f}",
            )
    table.notes = [
        f"{scrapes} scrapes per row after one warm-up; samples: lines of the exposition.",
        f"applying one job's metrics in the parent: median {statistics.median(apply_ms):.2f} ms "
        "(one Redis transaction + counter updates).",
        "target: the scrape after 10,000 jobs within 2x of the one after 10. Scrape time follows",
        "  the number of series (label sets seen so far), not the number of jobs applied.",
    ]
    return [table]
