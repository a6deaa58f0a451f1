"""Collectors of the exported registry: the recorded metrics without their ``_created``
series, and the gauges read from Redis at scrape time (rq's queues and registries,
and our outbox)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from redis import Redis
from redis.exceptions import RedisError
from rq.queue import Queue
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from worker.logs import log_event
from worker.metrics._families import GAUGES
from worker.redis_io import keys as redis_keys

# state -> key template of the rq sorted set holding the jobs in that state
_REGISTRY_TEMPLATES = {
    "started": StartedJobRegistry.key_template,
    "scheduled": ScheduledJobRegistry.key_template,
    "deferred": DeferredJobRegistry.key_template,
    "finished": FinishedJobRegistry.key_template,
    "failed": FailedJobRegistry.key_template,
    "canceled": CanceledJobRegistry.key_template,
}


class WithoutCreatedSeries(Collector):
    """The families of ``recorded`` as they are, less their ``<name>_created`` samples.

    prometheus-client adds a creation timestamp next to every counter and
    histogram series. The text format carries it as a separate gauge series, so
    it doubled every counter's series and half the scrape's cost grew with each
    new label set, while no alert or dashboard reads it (rates need no start time).
    """

    def __init__(self, recorded: CollectorRegistry) -> None:
        self._recorded = recorded

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        for family in self._recorded.collect():
            # Each collect builds fresh families: trimming them changes nothing recorded.
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class QueueCollector(Collector):
    """``agent_queue_jobs{queue,state}`` and ``agent_outbox_items``, in one Redis round trip.

    Counts are ZCARD/LLEN (constant time), so scrapes cost the same however many
    jobs ran. Every worker exports the same numbers: dashboards take ``max``.
    """

    def __init__(self, redis_factory: Callable[[], Redis], queue_names: Sequence[str]) -> None:
        self._redis_factory = redis_factory
        self._queue_names = list(queue_names)
        self._redis_failing = False

    def describe(self) -> Iterable[Metric]:
        # Lets the registry check names without a Redis call at registration.
        return [_queue_family(), _outbox_family()]

    def collect(self) -> Iterable[Metric]:
        queue_jobs = _queue_family()
        outbox = _outbox_family()
        try:
            counts, outbox_items = self._read_counts()
        except RedisError as exc:
            # Once per outage, not once per scrape.
            if not self._redis_failing:
                log_event("metrics_redis_unavailable", level="warning", error=str(exc))
            self._redis_failing = True
            return [queue_jobs, outbox]
        self._redis_failing = False
        for (queue_name, state), count in counts.items():
            queue_jobs.add_metric([queue_name, state], count)
        outbox.add_metric([], outbox_items)
        return [queue_jobs, outbox]

    def _read_counts(self) -> tuple[dict[tuple[str, str], int], int]:
        with self._redis_factory().pipeline(transaction=False) as pipe:
            order: list[tuple[str, str]] = []
            for queue_name in self._queue_names:
                pipe.llen(Queue.redis_queue_namespace_prefix + queue_name)
                order.append((queue_name, "queued"))
                for state, template in _REGISTRY_TEMPLATES.items():
                    pipe.zcard(template.format(queue_name))
                    order.append((queue_name, state))
            # The outbox is a list or a sorted set: ask both, keep the one that is not WRONGTYPE.
            pipe.llen(redis_keys.OUTBOX)
            pipe.zcard(redis_keys.OUTBOX)
            results = pipe.execute(raise_on_error=False)
        counts = dict(zip(order, (_as_count(value) for value in results), strict=False))
        outbox_items = max(_as_count(value) for value in results[len(order) :])
        return counts, outbox_items


class MemoryCollector(Collector):
    """``agent_memory_bytes{agent}``: what each agent's memory holds, from one HGETALL of the
    size table the memory store keeps (``worker.memory``); the same on every worker."""

    def __init__(self, redis_factory: Callable[[], Redis]) -> None:
        self._redis_factory = redis_factory

    def describe(self) -> Iterable[Metric]:
        return [_memory_family()]

    def collect(self) -> Iterable[Metric]:
        family = _memory_family()
        try:
            sizes = self._redis_factory().hgetall(redis_keys.MEMORY_BYTES)
        except RedisError:
            return [family]  # QueueCollector logs the outage once
        for agent, size in sorted(sizes.items()):  # type: ignore[union-attr]
            name = agent.decode(errors="replace") if isinstance(agent, bytes) else str(agent)
            family.add_metric([name], _as_count(int(size)))
        return [family]


def _memory_family() -> GaugeMetricFamily:
    help_text, labels = GAUGES["agent_memory_bytes"]
    return GaugeMetricFamily("agent_memory_bytes", help_text, labels=list(labels))


def _as_count(value: object) -> int:
    if isinstance(value, Exception):
        if isinstance(value, RedisError) and "WRONGTYPE" not in str(value):
            raise value
        return 0
    return int(value) if isinstance(value, int) else 0


def _queue_family() -> GaugeMetricFamily:
    help_text, labels = GAUGES["agent_queue_jobs"]
    return GaugeMetricFamily("agent_queue_jobs", help_text, labels=list(labels))


def _outbox_family() -> GaugeMetricFamily:
    help_text, labels = GAUGES["agent_outbox_items"]
    return GaugeMetricFamily("agent_outbox_items", help_text, labels=list(labels))
