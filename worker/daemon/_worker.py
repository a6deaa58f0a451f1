"""AgentWorker: rq's Worker made safe to run agent tasks (docs/contract.md).

Select it with ``RQ_WORKER_CLASS=worker.AgentWorker`` and start ``rq worker agents``.
Each job is vetted and settled by the parent (``worker.daemon._one_job``) and runs in a
forked job process, or, with WORKER_CONCURRENCY above 1, in one of that many job threads
of the worker process: the worker is then built as its threaded variant
(``worker.daemon._concurrent``), the class name operators pass unchanged.

Around that loop it always runs rq's scheduler (delayed requeues), a shorter
maintenance interval, a metrics endpoint, and it rides out Redis restarts and
refused writes (OOM, READONLY, LOADING: ``worker.redis_io._faults``). rq loads jobs
through ``CappedJob``, so a job hash cannot expand beyond JOB_DATA_MAX_BYTES.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, ClassVar, cast

from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from rq.connections import parse_connection
from rq.defaults import (
    DEFAULT_LOGGING_DATE_FORMAT,
    DEFAULT_LOGGING_FORMAT,
    DEFAULT_MAINTENANCE_TASK_INTERVAL,
)
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.worker import DequeueStrategy

from worker._signals import signals_left_to_the_main_thread
from worker.daemon._concurrent import JobThreadsWorker, threaded_variant
from worker.daemon._host import OWN_HOST, OwnHost, preload_configuration
from worker.daemon._logging import send_rq_logs_to_events
from worker.daemon._stopping import StopSignalsWorker
from worker.exceptions import ConfigurationError
from worker.hub_writes import drain_outbox_now
from worker.logs import log_event, set_level, set_redactor
from worker.metrics import JobMetrics, sweep_job_metrics
from worker.redaction import process_redactor
from worker.redis_io import (
    CappedJob,
    is_redis_outage,
    patient_redis_retry,
    require_matching_worker_connection,
)
from worker.settings import settings_or_exit
from worker.tracing import flush_spans, sweep_job_spans

__all__ = ["AgentWorker"]

HEALTH_CHECK_TIMEOUT_S = 2.0
# How long a stopping worker waits for its last spans to reach the collector.
SPAN_FLUSH_TIMEOUT_S = 5.0
# What rq's Worker.get_heartbeat_ttl adds to the job monitoring interval.
RQ_HEARTBEAT_GRACE_S = 60


class AgentWorker(StopSignalsWorker):
    """The rq worker of the agent fleet; subclass it to extend ``allowed_functions`` (tests).

    It forks a job process per job, as rq's ``Worker`` does. Built for a host that runs
    more than one task at once, it is its threaded variant instead (``__new__``).
    """

    # rq decompresses job data when it loads a job, before our vetting: capped there too.
    job_class = CappedJob
    # rq's 600 s lets a job orphaned by a dead parent run twice for ten minutes (trap 9).
    default_maintenance_interval_s: ClassVar[int] = 60
    # Delayed requeues only run when a scheduler runs (trap 10): always run one.
    run_scheduler: ClassVar[bool] = True
    # Metrics a dead parent never applied are swept by any worker after this long.
    metrics_sweep_after_s: ClassVar[float] = 120.0
    # rq's own margin past the monitoring interval; HEARTBEAT_GRACE_S replaces it at start.
    _heartbeat_grace_s: int = RQ_HEARTBEAT_GRACE_S
    # Tasks at once: one job process at a time (the threaded variant reads its own at start).
    concurrency: int = 1

    def __new__(cls, *args: Any, **kwargs: Any) -> AgentWorker:
        """The mode, picked as rq builds the worker: ``cls`` forks a job process per job;
        with more than one task at once (WORKER_CONCURRENCY, or the pool's ``--concurrency``)
        it is built as ``threaded_variant(cls)``, which keeps its name. A worker rq builds
        only to read another's record (``rq info``, ``Worker.all()``: it passes
        ``prepare_for_work=False``) reads no settings (trap 1)."""
        mode: type[AgentWorker] = cls
        if kwargs.get("prepare_for_work", True) and not issubclass(cls, JobThreadsWorker):
            host: OwnHost = kwargs.get("host", OWN_HOST)
            if host.tasks_at_once(settings_or_exit()) > 1:
                mode = cast(type[AgentWorker], threaded_variant(cls))
        return super().__new__(mode)

    def __init__(self, queues: Any, *args: Any, host: OwnHost = OWN_HOST, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        # ``host``: what it does for its host besides jobs (``agent-worker pool`` passes its own).
        self.host = host
        kwargs["serializer"] = JSONSerializer
        # rq's CLI always passes its default job class; ours caps what a job hash expands to.
        if kwargs.get("job_class") in (None, Job, "rq.job.Job"):
            kwargs["job_class"] = CappedJob
        maintenance_interval = kwargs.get("maintenance_interval", DEFAULT_MAINTENANCE_TASK_INTERVAL)
        if maintenance_interval == DEFAULT_MAINTENANCE_TASK_INTERVAL:
            kwargs["maintenance_interval"] = self.default_maintenance_interval_s
        # rq's CLI hands over pickle queues; by name they are rebuilt with our serializer.
        super().__init__(_queue_names(queues), *args, **kwargs)
        self._metrics_port: int | None = None
        self._redis_retry = patient_redis_retry()

    # -- lifecycle -------------------------------------------------------------------------

    def work(
        self,
        burst: bool = False,
        logging_level: str | None = None,
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
        max_jobs: int | None = None,
        max_idle_time: int | None = None,
        with_scheduler: bool = False,
        dequeue_strategy: DequeueStrategy = DequeueStrategy.DEFAULT,
    ) -> bool:
        worked: bool = super().work(
            burst=burst,
            logging_level=logging_level,
            date_format=date_format,
            log_format=log_format,
            max_jobs=max_jobs,
            max_idle_time=max_idle_time,
            with_scheduler=with_scheduler or self.run_scheduler,
            dequeue_strategy=dequeue_strategy,
        )
        return worked

    def bootstrap(
        self,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        settings = settings_or_exit()
        _require_sentinel_connection_if_configured(self.connection)
        # Before rq forks anything: job processes and rq's scheduler inherit the retry.
        self._redis_retry = patient_redis_retry(settings.redis_patience_s)
        self.connection.set_retry(self._redis_retry)
        set_level(settings.log_level)
        set_redactor(process_redactor(settings.secret_values()))
        send_rq_logs_to_events()
        self._timeout_grace_s = settings.job_timeout_grace_s
        self._heartbeat_grace_s = settings.heartbeat_grace_s
        self._result_ttl_s = settings.result_ttl_s
        CappedJob.max_data_bytes = settings.job_data_max_bytes
        self._import_job_modules()
        self.host.prepare(settings, self.connection, self._preload_configuration)
        super().bootstrap(logging_level, date_format, log_format)
        self._metrics_port = self.host.serve_metrics(
            settings, self._health_check_client, self.queue_names()
        )
        # What start-up loaded stays for good: the collector leaves it, and the pages it
        # sits on, alone, so a forked job process does not copy them by collecting.
        gc.freeze()
        log_event(
            "worker_started",
            worker=self.name,
            pid=os.getpid(),
            queues=self.queue_names(),
            metrics_port=self._metrics_port,
            scheduler=self.run_scheduler,
            concurrency=self.concurrency,
            maintenance_interval_s=self.maintenance_interval,
        )

    def subscribe(self) -> None:
        # rq's command listener thread (stop-job, shutdown) must not take the process's
        # signals from the main thread (worker._signals).
        with signals_left_to_the_main_thread():
            super().subscribe()  # type: ignore[no-untyped-call]

    def unsubscribe(self) -> None:
        # rq unsubscribes, then tells the listener thread to stop and joins it for up to
        # 1 s. The unsubscribe's reply can wake the thread before it is told: it then
        # waits 60 s for a subscription, and every stopping worker paid rq's whole second.
        # Told first, the thread ends on that reply.
        if self.pubsub_thread is not None:
            self.pubsub_thread.stop()
        super().unsubscribe()  # type: ignore[no-untyped-call]

    def _import_job_modules(self) -> None:
        self.import_job_modules()

    @classmethod
    def import_job_modules(cls) -> None:
        """Import the allowed job functions' modules once, here, instead of in every job.

        Each job process is a fork of this one: without this, every job would
        pay seconds of imports (provider SDKs, MCP). Only names from the
        allow-list are imported, never a name read from a job.
        """
        modules = sorted({name.rpartition(".")[0] for name in cls.allowed_functions})
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:
                # The job will fail visibly in rq; the worker still serves the rest.
                log_event("job_module_import_failed", level="error", module=module, error=str(exc))

    def configured_concurrency(self) -> int:
        return self.host.tasks_at_once(settings_or_exit())

    def _preload_configuration(self, providers: frozenset[str]) -> None:
        """Parse MCP_CONFIG, GRANT_POLICY and PRICES_FILE once; a bad file stops start-up."""
        preload_configuration(providers)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        # Idle with nothing in flight, a stopping worker has nothing to wait out an outage
        # for: its heartbeat and teardown fail at once instead of ~33 s each.
        if self._stop.waiting_for_job and not self.has_runs_in_flight():
            self._redis_retry.stop_waiting()
        super().request_stop(signum, frame)

    def teardown(self) -> None:
        self._redis_retry.stop_waiting()  # nothing runs any more
        try:
            super().teardown()
        except RedisError as exc:
            if not is_redis_outage(exc):
                raise
            # rq could not unregister the worker; its key expires on its own.
            self._note_outage("teardown", exc)
        finally:
            if not self.is_horse:
                # Not left to atexit: rq worker-pool's workers end with os._exit.
                from worker.tools import close_stdio_pool

                close_stdio_pool()
                # Not left to atexit either: the spans batched across the last tasks.
                flush_spans(SPAN_FLUSH_TIMEOUT_S)
                self.host.stop_serving(settings_or_exit())
                log_event("worker_stopped", worker=self.name, pid=os.getpid())

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """rq's TTL of a job's execution (the monitoring interval plus a fixed 60 s), with
        HEARTBEAT_GRACE_S in place of those 60 s: past it, maintenance re-runs the job."""
        rq_ttl: int = super().get_heartbeat_ttl(job, working_time)
        return rq_ttl - RQ_HEARTBEAT_GRACE_S + self._heartbeat_grace_s

    @property
    def dequeue_timeout(self) -> int:
        # rq blocks up to worker_ttl - 15 s (405 s) on an idle queue; waking up every
        # maintenance interval keeps maintenance and the scheduler check at their pace.
        return max(1, min(self.worker_ttl - 15, self.maintenance_interval))

    def _health_check_client(self) -> Redis:
        return health_check_client(self.connection)

    # -- our own Redis housekeeping (maintenance; outages are ridden out around it) --------

    def maintain_own_data(self) -> None:
        sweep_job_metrics(self.connection, older_than_s=self.metrics_sweep_after_s)
        sweep_job_spans(self.connection, older_than_s=self.metrics_sweep_after_s)
        # The parent's own metrics: no fork in between, so they apply locally.
        metrics = JobMetrics()
        try:
            drain_outbox_now(self.connection, on_dead_letter=metrics.dead_letter)
        finally:
            metrics.apply_locally()


def health_check_client(connection: Redis) -> Redis:
    """A client to ``connection``'s Redis with short timeouts, for scrapes and /healthz."""
    redis_class, connection_class, connection_kwargs = parse_connection(connection)
    connection_kwargs.update(
        socket_timeout=HEALTH_CHECK_TIMEOUT_S,
        socket_connect_timeout=HEALTH_CHECK_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
    pool = ConnectionPool(connection_class=connection_class, **connection_kwargs)
    client: Redis = redis_class(connection_pool=pool)
    return client


def _require_sentinel_connection_if_configured(connection: Redis) -> None:
    """With REDIS_SENTINELS set, rq must have built a Sentinel-managed connection (RQ_CONFIG)."""
    try:
        require_matching_worker_connection(connection, settings_or_exit())
    except ConfigurationError as exc:
        print(f"agent-worker: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


def _queue_names(queues: Any) -> list[str]:
    listed: Sequence[Any] = [queues] if isinstance(queues, str | Queue) else list(queues)
    return [queue.name if isinstance(queue, Queue) else str(queue) for queue in listed]
