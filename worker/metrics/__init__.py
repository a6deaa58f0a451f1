"""Prometheus metrics (docs/reference/metrics.md lists them), exported by the worker parent.

A job process records into a ``JobMetrics`` buffer and flushes it to Redis; the
parent applies it (``apply_job_metrics``) into its ``WorkerMetrics`` and serves
scrapes (``start_metrics_server``). Inside: ``_recorders`` (those objects),
``_families`` (the metric names and labels, a contract), ``_collector`` (the queue
gauges read at scrape time) and ``_server`` (the HTTP endpoint).
"""

from __future__ import annotations

from worker.metrics._families import COUNTERS, GAUGES, HISTOGRAMS, POOL_COUNTERS, POOL_GAUGES
from worker.metrics._recorders import (
    JOB_METRICS_TTL_S,
    JobMetrics,
    WorkerMetrics,
    apply_forwarded,
    apply_job_metrics,
    forward_metrics,
    start_metrics_server,
    stop_metrics_server,
    sweep_job_metrics,
    worker_metrics,
)

__all__ = [
    "COUNTERS",
    "GAUGES",
    "HISTOGRAMS",
    "JOB_METRICS_TTL_S",
    "POOL_COUNTERS",
    "POOL_GAUGES",
    "JobMetrics",
    "WorkerMetrics",
    "apply_forwarded",
    "apply_job_metrics",
    "forward_metrics",
    "start_metrics_server",
    "stop_metrics_server",
    "sweep_job_metrics",
    "worker_metrics",
]
