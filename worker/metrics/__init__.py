"""Prometheus metrics (docs/reference/metrics.md lists them), exported by the worker parent.

A job process records into a ``JobMetrics`` buffer and flushes it to Redis; the
parent applies it (``apply_job_metrics``) into its ``WorkerMetrics`` and serves
scrapes (``start_metrics_server``). Inside: ``_recorders`` (those objects),
``_families`` (the metric names and labels, a contract), ``_collector`` (the queue
gauges read at scrape time) and ``_server`` (the HTTP endpoint).
"""

from __future__ import annotations

from worker.metrics._families import COUNTERS as COUNTERS
from worker.metrics._families import GAUGES as GAUGES
from worker.metrics._families import HISTOGRAMS as HISTOGRAMS
from worker.metrics._families import POOL_COUNTERS as POOL_COUNTERS
from worker.metrics._families import POOL_GAUGES as POOL_GAUGES
from worker.metrics._recorders import JobMetrics as JobMetrics
from worker.metrics._recorders import apply_forwarded as apply_forwarded
from worker.metrics._recorders import apply_job_metrics as apply_job_metrics
from worker.metrics._recorders import forward_metrics as forward_metrics
from worker.metrics._recorders import start_metrics_server as start_metrics_server
from worker.metrics._recorders import stop_metrics_server as stop_metrics_server
from worker.metrics._recorders import sweep_job_metrics as sweep_job_metrics
from worker.metrics._recorders import worker_metrics as worker_metrics
