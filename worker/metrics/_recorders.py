"""The metric objects: the parent's WorkerMetrics, a job's JobMetrics buffer, and their hand-off.

rq forks one process per job, so a job never touches the parent's metric
objects (their locks were copied at fork, trap 7). Inside a job, record into a
``JobMetrics`` buffer and ``flush`` it to one Redis key; the parent applies the
key right after the job process exits (``apply_job_metrics``) and sweeps keys
whose parent died (``sweep_job_metrics``). Scrapes read in-memory metrics plus
a handful of Redis counters, so their cost does not grow with jobs run. A task's
duration carries the trace id of its run as an exemplar (OpenMetrics), when it was traced.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from redis import Redis
from redis.exceptions import RedisError

from worker.logs import log_event
from worker.metrics._batches import Increments, entries, exemplars
from worker.metrics._collector import MemoryCollector, QueueCollector, WithoutCreatedSeries
from worker.metrics._families import (
    COUNTERS,
    HISTOGRAMS,
    KNOWN_LABEL_SETS,
    LABEL_VALUE_CAPS,
    OTHER_LABEL,
    UNDECODABLE_JOBS,
)
from worker.metrics._server import start_server, stop_servers
from worker.redis_io import keys as redis_keys
from worker.redis_io import take_job_list
from worker.tracing import sampled_trace_id

JOB_METRICS_TTL_S = 86_400


class WorkerMetrics:
    """The worker parent's metrics, in their own CollectorRegistry (never the global one)."""

    def __init__(self) -> None:
        # The metric objects record into ``recorded``; ``registry`` is what /metrics
        # serves: the recorded families (without _created), then the Redis gauges.
        recorded = CollectorRegistry()
        self.registry = CollectorRegistry()
        self.registry.register(WithoutCreatedSeries(recorded))
        self._counters = {
            name: (Counter(name, help_text, labels, registry=recorded), labels)
            for name, (help_text, labels) in COUNTERS.items()
        }
        self._histograms = {
            name: (
                Histogram(name, help_text, labels, buckets=buckets, registry=recorded),
                labels,
            )
            for name, (help_text, labels, buckets) in HISTOGRAMS.items()
        }
        self._queue_collector: QueueCollector | None = None
        self._memory_collector: MemoryCollector | None = None
        self._label_values: dict[str, set[str]] = {}
        self._start_known_series()

    def watch_queues(self, redis_factory: Callable[[], Redis], queue_names: Sequence[str]) -> None:
        """Export ``agent_queue_jobs``, ``agent_outbox_items`` and ``agent_memory_bytes``,
        read from Redis per scrape."""
        for collector in (self._queue_collector, self._memory_collector):
            if collector is not None:
                self.registry.unregister(collector)
        self._queue_collector = QueueCollector(redis_factory, queue_names)
        self._memory_collector = MemoryCollector(redis_factory)
        self.registry.register(self._queue_collector)
        self.registry.register(self._memory_collector)

    def _bounded(self, names: tuple[str, ...], labels: tuple[str, ...]) -> tuple[str, ...]:
        """``labels`` with a free-form value past its cap of distinct values as "other"."""
        bounded = []
        for name, value in zip(names, labels, strict=True):
            cap = LABEL_VALUE_CAPS.get(name)
            seen = self._label_values.setdefault(name, set()) if cap is not None else None
            if seen is not None and cap is not None and value not in seen:
                if len(seen) >= cap:
                    value = OTHER_LABEL
                else:
                    seen.add(value)
            bounded.append(value)
        return tuple(bounded)

    def _start_known_series(self) -> None:
        """Every label set known in advance at 0, so the first scrape shows it and the
        alerts' ``increase()`` counts its first event (Prometheus's own advice). Only closed
        sets: a series per agent, tool or model would grow the exposition for events most
        never have."""
        for name, label_sets in KNOWN_LABEL_SETS.items():
            counter = self._counters[name][0]
            for labels in label_sets:
                counter.labels(*labels)

    def redis_unavailable(self, kind: str) -> None:
        """One wait for Redis (``kind`` from ``worker.redis_io._faults.outage_kind``)."""
        self.apply({"counters": [["agent_redis_unavailable_total", [kind], 1]]})

    def job_undecodable(self) -> None:
        """One rq job failed unread: its data could not be decoded."""
        self.apply({"counters": [[UNDECODABLE_JOBS, [], 1]]})

    def apply(self, batch: Mapping[str, Any]) -> None:
        """Add one flushed ``JobMetrics`` batch, skipping entries that break the contract."""
        for name, labels, value in entries(batch.get("counters")):
            counter = self._counters.get(name)
            if (
                counter is None
                or len(labels) != len(counter[1])
                or not isinstance(value, int | float)
            ):
                continue
            if value >= 0:
                labels = self._bounded(counter[1], labels)
                (counter[0].labels(*labels) if labels else counter[0]).inc(value)
        traces = exemplars(batch)
        for name, labels, values in entries(batch.get("observations")):
            histogram = self._histograms.get(name)
            if (
                histogram is None
                or len(labels) != len(histogram[1])
                or not isinstance(values, list)
            ):
                continue
            child = histogram[0].labels(*labels) if labels else histogram[0]
            numbers = [value for value in values if isinstance(value, int | float)]
            trace_id = traces.get((name, labels))
            for index, value in enumerate(numbers):
                # The last observation names its trace: Grafana links the point to it.
                last = index == len(numbers) - 1
                child.observe(value, {"trace_id": trace_id} if last and trace_id else None)


class ForwardedMetrics(WorkerMetrics):
    """The metrics of a worker in ``agent-worker pool``: each batch goes to the pool's process,
    which serves the host's one /metrics (``send`` writes one JSON line to it)."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        super().__init__()
        self._send = send

    def apply(self, batch: Mapping[str, Any]) -> None:
        self._send(json.dumps(batch, separators=(",", ":")).encode() + b"\n")

    def _start_known_series(self) -> None:
        """Nothing: this registry is never served; the pool's has them from its start."""


def apply_forwarded(line: bytes, *, metrics: WorkerMetrics | None = None) -> None:
    """Apply one batch a pooled worker forwarded (``ForwardedMetrics``); garbage is skipped."""
    try:
        batch = json.loads(line)
    except ValueError:
        batch = None
    if isinstance(batch, dict):
        (metrics or worker_metrics()).apply(batch)
    else:
        log_event("forwarded_metrics_malformed", level="warning")


_default_metrics: WorkerMetrics | None = None
_default_lock = threading.Lock()


def forward_metrics(send: Callable[[bytes], None]) -> None:
    """From now on this process's metrics go to ``send`` (a worker forked by the pool)."""
    global _default_metrics
    with _default_lock:
        _default_metrics = ForwardedMetrics(send)


def worker_metrics() -> WorkerMetrics:
    """This process's metrics (created on first use)."""
    global _default_metrics
    with _default_lock:
        if _default_metrics is None:
            _default_metrics = WorkerMetrics()
        return _default_metrics


class JobMetrics:
    """Metric increments recorded inside a job process.

    Call ``flush(redis, job_id)`` before the job returns (the worker parent
    applies the increments once the job process has exited), or
    ``apply_locally()`` when the task ran in the worker's own process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The trace of an observation is kept as its exemplar (the task duration's).
        self._buffer = Increments()

    def task_finished(
        self,
        *,
        agent: str,
        task_type: str,
        outcome: str,
        duration_s: float,
        iterations: int,
        cost_usd: float | None,
    ) -> None:
        with self._lock:
            self._buffer.count("agent_tasks_total", (agent, task_type, outcome))
            self._buffer.observe("agent_task_duration_seconds", (task_type,), duration_s)
            if (trace_id := sampled_trace_id()) is not None:
                self._buffer.exemplars[("agent_task_duration_seconds", (task_type,))] = trace_id
            self._buffer.observe("agent_loop_iterations", (task_type,), iterations)
            # An unknown price is not a zero cost: leave the counter alone.
            if cost_usd is not None:
                self._buffer.count("agent_cost_usd_total", (agent,), cost_usd)

    def llm_call(
        self,
        *,
        provider: str,
        model: str,
        status: str,
        tokens_input: int,
        tokens_output: int,
        tokens_cache_read: int = 0,
        tokens_cache_write: int = 0,
    ) -> None:
        """``tokens_input`` counts every input token; the cache directions count the part of
        them the provider read from or wrote to its prompt cache."""
        with self._lock:
            self._buffer.count("agent_llm_calls_total", (provider, model, status))
            self._buffer.count("agent_llm_tokens_total", (model, "input"), tokens_input)
            self._buffer.count("agent_llm_tokens_total", (model, "output"), tokens_output)
            if tokens_cache_read:
                self._buffer.count(
                    "agent_llm_tokens_total", (model, "cache_read"), tokens_cache_read
                )
            if tokens_cache_write:
                self._buffer.count(
                    "agent_llm_tokens_total", (model, "cache_write"), tokens_cache_write
                )

    def embeddings_call(self, *, model: str, tokens: int) -> None:
        """The tokens of a memory embeddings call: model spend, counted with the model's
        (as input tokens of the embeddings model); not a model call of the loop."""
        with self._lock:
            self._buffer.count("agent_llm_tokens_total", (model, "input"), tokens)

    def tool_call(self, *, server: str, tool: str, outcome: str, duration_s: float) -> None:
        with self._lock:
            self._buffer.count("agent_tool_calls_total", (server, tool, outcome))
            self._buffer.observe("agent_tool_call_duration_seconds", (server,), duration_s)

    def grant_denied(self, *, agent: str, tool: str) -> None:
        with self._lock:
            self._buffer.count("agent_grant_denials_total", (agent, tool))

    def error_posted(self) -> None:
        with self._lock:
            self._buffer.count("agent_errors_posted_total", ())

    def budget_check_unreachable(self, *, agent: str) -> None:
        with self._lock:
            self._buffer.count("agent_budget_check_unreachable_total", (agent,))

    def dead_letter(self, kind: str) -> None:
        with self._lock:
            self._buffer.count("agent_outbox_dead_letters_total", (kind,))

    def write_refused(self, *, agent: str, kind: str, reason: str) -> None:
        with self._lock:
            self._buffer.count("agent_hub_writes_refused_total", (agent, kind, reason))

    def scope_refused(self, *, agent: str, tool: str) -> None:
        with self._lock:
            self._buffer.count("agent_scope_refusals_total", (agent, tool))

    def egress_refused(self, *, agent: str, tool: str) -> None:
        with self._lock:
            self._buffer.count("agent_egress_refusals_total", (agent, tool))

    def memory_recalled(self, *, agent: str, strategy: str, hits: int, duration_s: float) -> None:
        with self._lock:
            self._buffer.count("agent_memory_recalls_total", (agent, strategy))
            self._buffer.count("agent_memory_recall_hits_total", (agent,), hits)
            self._buffer.observe("agent_memory_recall_duration_seconds", (), duration_s)

    def memory_written(self, *, agent: str, kinds: Sequence[str], evicted: int) -> None:
        with self._lock:
            for kind in kinds:
                self._buffer.count("agent_memory_writes_total", (agent, kind))
            if evicted:
                self._buffer.count("agent_memory_evictions_total", (agent,), evicted)

    def flush(self, redis: Redis, job_id: str, *, ttl_s: int = JOB_METRICS_TTL_S) -> bool:
        """Append the buffer to the job's Redis key; False (buffer kept) on a Redis error."""
        batch = self._take()
        if batch is None:
            return True
        # Named, so a push Redis ran before a restart and the retry sent again counts once.
        named = {**batch, "id": secrets.token_hex(8)}
        try:
            with redis.pipeline(transaction=True) as pipe:
                key = redis_keys.job_metrics(job_id)
                pipe.rpush(key, json.dumps(named))
                pipe.expire(key, ttl_s)
                pipe.zadd(redis_keys.JOB_METRICS_PENDING, {job_id: time.time()}, nx=True)
                pipe.execute()
        except RedisError as exc:
            self._put_back(batch)
            log_event("job_metrics_flush_failed", level="warning", job_id=job_id, error=str(exc))
            return False
        return True

    def apply_locally(self, metrics: WorkerMetrics | None = None) -> None:
        """Add the buffered increments to this process's metrics (no fork in between)."""
        batch = self._take()
        if batch is not None:
            (metrics or worker_metrics()).apply(batch)

    def _take(self) -> dict[str, Any] | None:
        with self._lock:
            batch = self._buffer.batch()
            if batch is not None:
                self._buffer = Increments()
            return batch

    def _put_back(self, batch: dict[str, Any]) -> None:
        with self._lock:
            self._buffer.add_batch(batch)


def apply_job_metrics(redis: Redis, job_id: str, *, metrics: WorkerMetrics | None = None) -> bool:
    """Apply what a finished job process flushed; True if there was anything.

    Reading and deleting happen in one transaction, so two workers sweeping the
    same key can never count it twice.
    """
    raw_batches = take_job_list(
        redis, redis_keys.job_metrics(job_id), redis_keys.JOB_METRICS_PENDING, job_id
    )
    target = metrics or worker_metrics()
    applied: set[object] = set()
    for raw in raw_batches:
        try:
            batch = json.loads(raw)
        except ValueError:
            batch = None
        if isinstance(batch, dict):
            batch_id = batch.get("id")  # None from a worker before batches had one
            if batch_id is not None and batch_id in applied:
                continue  # the same push twice: Redis ran it, the answer was lost
            applied.add(batch_id)
            target.apply(batch)
        else:
            log_event("job_metrics_malformed", level="warning", job_id=job_id)
    return bool(raw_batches)


def sweep_job_metrics(
    redis: Redis, *, older_than_s: float, metrics: WorkerMetrics | None = None, limit: int = 100
) -> int:
    """Apply metrics of jobs whose worker died before applying them; returns how many."""
    cutoff = time.time() - older_than_s
    stale_ids = redis.zrangebyscore(
        redis_keys.JOB_METRICS_PENDING, "-inf", cutoff, start=0, num=limit
    )
    applied = 0
    for raw_id in stale_ids:
        job_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        if apply_job_metrics(redis, job_id, metrics=metrics):
            applied += 1
    return applied


def start_metrics_server(
    port: int,
    redis_factory: Callable[[], Redis],
    *,
    queue_names: Sequence[str] = ("agents",),
    host: str = "0.0.0.0",
    metrics: WorkerMetrics | None = None,
) -> int | None:
    """Serve ``/metrics`` and ``/healthz`` from a daemon thread of this process.

    Port 0 disables it. When the port is taken the next ones are tried, up to
    ``port + 16``; returns the port used, or None when none was free.
    ``redis_factory`` builds the client used at scrape time and for the health
    check (give it short timeouts: a scrape must not hang on a dead Redis).
    """
    if port == 0:
        return None
    target = metrics or worker_metrics()
    shared_client = _created_once(redis_factory)
    target.watch_queues(shared_client, queue_names)
    return start_server(port, host=host, registry=target.registry, redis_factory=shared_client)


def _created_once(redis_factory: Callable[[], Redis]) -> Callable[[], Redis]:
    lock = threading.Lock()
    clients: list[Redis] = []

    def client() -> Redis:
        with lock:
            if not clients:
                clients.append(redis_factory())
            return clients[0]

    return client


def stop_metrics_server() -> None:
    """Stop every metrics server this process started."""
    stop_servers()
