"""AgentWorker: rq's forking Worker made safe to run agent tasks (docs/contract.md).

Select it with ``RQ_WORKER_CLASS=worker.AgentWorker`` and start ``rq worker agents``.
Per job, the parent process:

    check the raw job against the allow-list   (refuse or fail it, never import it)
    drop a producer's meta.requeue/report      (only the job itself sets them)
    make sure rq's timeout covers the deadline (rq's kill is only a backstop)
    give an agent task its crash re-runs       (rq retries a killed or abandoned job)
    fork and monitor the job process           (rq)
    apply the job's metrics                    (the job process never touches them)
    kill process groups the job left behind
    re-enqueue the task if the job asked for it

Around that loop it always runs rq's scheduler (delayed requeues), a shorter
maintenance interval, a metrics endpoint, and it rides out Redis restarts and
refused writes (OOM, READONLY, LOADING: ``worker.redis_faults``). rq loads jobs
through ``CappedJob``, so a job hash cannot expand beyond JOB_DATA_MAX_BYTES.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from prometheus_client import write_to_textfile
from redis import ConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from rq.connections import parse_connection
from rq.defaults import (
    DEFAULT_FAILURE_TTL,
    DEFAULT_LOGGING_DATE_FORMAT,
    DEFAULT_LOGGING_FORMAT,
    DEFAULT_MAINTENANCE_TASK_INTERVAL,
)
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, now, utcformat
from rq.worker import DequeueStrategy

from worker._job_timeout import run_timeout_s
from worker._worker_children import kill_recorded_process_groups, register_child_process
from worker._worker_logging import send_rq_logs_to_events
from worker._worker_outages import OutageTolerantWorker
from worker._worker_vetting import (
    JOB_CONTROL_FIELDS,
    CappedJob,
    JobCheck,
    Verdict,
    check_job,
    producer_control_fields,
)
from worker.agents import AgentStore
from worker.control import LeaseLost
from worker.enqueue import (
    DEFAULT_MAX_DURATION_S,
    DEFAULT_RESULT_TTL_S,
    DEFAULT_TIMEOUT_GRACE_S,
    JOB_FUNCTION,
    enqueue_task,
)
from worker.exceptions import ConfigurationError, InvalidTask, WorkerError
from worker.leases import release_lease_of
from worker.logs import log_event, set_level, set_redactor
from worker.metrics import (
    apply_job_metrics,
    start_metrics_server,
    stop_metrics_server,
    sweep_job_metrics,
    worker_metrics,
)
from worker.operations import check_at_start
from worker.outbox import drain_outbox_now
from worker.redaction import process_redactor
from worker.redis_connection import require_matching_worker_connection
from worker.redis_faults import (
    is_redis_outage,
    patient_redis_retry,
)
from worker.settings import settings_or_exit
from worker.task import Outcome, parse_task

__all__ = ["AgentWorker", "patient_redis_retry", "register_child_process"]

HEALTH_CHECK_TIMEOUT_S = 2.0


class AgentWorker(OutageTolerantWorker):
    """The rq worker of the agent fleet; subclass it to extend ``allowed_functions`` (tests)."""

    allowed_functions: ClassVar[frozenset[str]] = frozenset({JOB_FUNCTION})
    # rq decompresses job data when it loads a job, before our vetting: capped there too.
    job_class = CappedJob
    # rq's 600 s lets a job orphaned by a dead parent run twice for ten minutes (trap 9).
    default_maintenance_interval_s: ClassVar[int] = 60
    # Delayed requeues only run when a scheduler runs (trap 10): always run one.
    run_scheduler: ClassVar[bool] = True
    # Metrics a dead parent never applied are swept by any worker after this long.
    metrics_sweep_after_s: ClassVar[float] = 120.0
    # A failure with one of these outcomes would fail the same way again (trap 11).
    never_retried_outcomes: ClassVar[frozenset[str]] = frozenset(
        {Outcome.INVALID_TASK, Outcome.AUTONOMY_VIOLATION, Outcome.MODEL_ERROR}
    )
    # How often rq may run an agent task again after its job process died mid-task (killed,
    # OOM, orphaned by a dead worker, cold shutdown). Without retries rq moves such a job
    # to the failed registry; with them it re-enqueues it, and the re-run resumes from the
    # task's checkpoint. A task that ends with an outcome is never retried (run_task sets
    # retries_left to 0 before failing).
    crash_reruns: ClassVar[int] = 3

    def __init__(self, queues: Any, *args: Any, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        kwargs["serializer"] = JSONSerializer
        # rq's CLI always passes its default job class; ours caps what a job hash expands to.
        if kwargs.get("job_class") in (None, Job, "rq.job.Job"):
            kwargs["job_class"] = CappedJob
        maintenance_interval = kwargs.get("maintenance_interval", DEFAULT_MAINTENANCE_TASK_INTERVAL)
        if maintenance_interval == DEFAULT_MAINTENANCE_TASK_INTERVAL:
            kwargs["maintenance_interval"] = self.default_maintenance_interval_s
        # rq's CLI hands over pickle queues; by name they are rebuilt with our serializer.
        super().__init__(_queue_names(queues), *args, **kwargs)
        self._timeout_grace_s: int = DEFAULT_TIMEOUT_GRACE_S
        self._result_ttl_s: int = DEFAULT_RESULT_TTL_S
        self._metrics_port: int | None = None
        # Jobs whose failure must not be retried; the job process inherits it at fork.
        self._final_job_ids: set[str] = set()
        self._agents: AgentStore | None = None  # made on first use, never in __init__

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
        self.connection.set_retry(patient_redis_retry())
        set_level(settings.log_level)
        set_redactor(process_redactor(settings.secret_values()))
        send_rq_logs_to_events()
        self._timeout_grace_s = settings.job_timeout_grace_s
        self._result_ttl_s = settings.result_ttl_s
        CappedJob.max_data_bytes = settings.job_data_max_bytes
        self._import_job_modules()
        # The checks of `agent-worker check`; an error stops here. The definitions they read
        # are cached in Redis for the first tasks, so each is read (and warns) once.
        check_at_start(settings, agent_cache=self.connection)
        self._preload_configuration()
        super().bootstrap(logging_level, date_format, log_format)
        self._metrics_port = start_metrics_server(
            settings.metrics_port,
            self._health_check_client,
            queue_names=self.queue_names(),
            host=settings.metrics_host,
        )
        log_event(
            "worker_started",
            worker=self.name,
            pid=os.getpid(),
            queues=self.queue_names(),
            metrics_port=self._metrics_port,
            scheduler=self.run_scheduler,
            maintenance_interval_s=self.maintenance_interval,
        )

    def _import_job_modules(self) -> None:
        """Import the allowed job functions' modules once, here, instead of in every job.

        Each job process is a fork of this one: without this, every job would
        pay seconds of imports (provider SDKs, MCP). Only names from the
        allow-list are imported, never a name read from a job.
        """
        modules = sorted({name.rpartition(".")[0] for name in self.allowed_functions})
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:
                # The job will fail visibly in rq; the worker still serves the rest.
                log_event("job_module_import_failed", level="error", module=module, error=str(exc))

    def _preload_configuration(self) -> None:
        """Parse MCP_CONFIG, GRANT_POLICY and PRICES_FILE once; a bad file stops start-up."""
        from worker.pipeline import preload

        try:
            preload()
        except WorkerError as exc:
            print(f"agent-worker: {exc.message}", file=sys.stderr)
            raise SystemExit(2) from None

    def teardown(self) -> None:
        try:
            super().teardown()  # type: ignore[no-untyped-call]
        finally:
            if not self.is_horse:
                self._write_metrics_textfile()
                stop_metrics_server()
                log_event("worker_stopped", worker=self.name, pid=os.getpid())

    def _write_metrics_textfile(self) -> None:
        """For burst or cron workers nobody scrapes: the textfile-collector convention."""
        path = settings_or_exit().metrics_textfile
        if path is None:
            return
        try:
            write_to_textfile(str(path), worker_metrics().registry)
        except OSError as exc:
            log_event("metrics_textfile_failed", level="error", path=str(path), error=str(exc))

    @property
    def dequeue_timeout(self) -> int:
        # rq blocks up to worker_ttl - 15 s (405 s) on an idle queue; waking up every
        # maintenance interval keeps maintenance and the scheduler check at their pace.
        return max(1, min(self.worker_ttl - 15, self.maintenance_interval))

    def _health_check_client(self) -> Redis:
        """A client to the worker's Redis with short timeouts, for scrapes and /healthz."""
        redis_class, connection_class, connection_kwargs = parse_connection(self.connection)
        connection_kwargs.update(
            socket_timeout=HEALTH_CHECK_TIMEOUT_S,
            socket_connect_timeout=HEALTH_CHECK_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        pool = ConnectionPool(connection_class=connection_class, **connection_kwargs)
        client: Redis = redis_class(connection_pool=pool)
        return client

    # -- one job ---------------------------------------------------------------------------

    def execute_job(self, job: Job, queue: Queue) -> None:
        check = self._until_redis_answers(
            "check_job",
            lambda: check_job(
                self.connection,
                job.key,
                self.allowed_functions,
                max_data_bytes=CappedJob.max_data_bytes,
            ),
        )
        if check.verdict is Verdict.VANISHED:
            log_event("job_vanished", level="warning", job_id=job.id, queue=queue.name)
            self._until_redis_answers(
                "drop_job", lambda: self._drop_from_intermediate(queue, job.id)
            )
            return
        if check.verdict is not Verdict.RUNNABLE:
            self._fail_without_running(job, queue, check)
            return
        self._clear_producer_control(job)
        self._cover_deadline(job, check)
        self._allow_crash_reruns(job, check)
        try:
            super().execute_job(job, queue)
        except RedisError as exc:
            if not is_redis_outage(exc):
                raise
            # Only rq's bookkeeping around the job process can raise here; the job
            # stays in the started registry and rq's maintenance settles it.
            log_event("job_bookkeeping_failed", level="error", job_id=job.id, error=str(exc))
        except SystemExit:
            # rq's cold shutdown (a second SIGTERM/SIGINT) killed the job process.
            self._hand_back_after_cold_shutdown(job, queue)
            raise
        finally:
            self._final_job_ids.discard(job.id)
        self._after_job(job, check)

    def _clear_producer_control(self, job: Job) -> None:
        """Drop ``meta.requeue``/``meta.report`` a producer wrote: only the run sets them."""
        raw_meta = self._until_redis_answers(
            "read_job_meta", lambda: self.connection.hget(job.key, "meta")
        )
        cleaned = producer_control_fields(raw_meta)
        if cleaned is None:
            return
        log_event(
            "job_meta_cleared",
            level="warning",
            job_id=job.id,
            fields=[field for field in JOB_CONTROL_FIELDS if field in (job.meta or {})],
        )
        job.meta = cleaned
        self._until_redis_answers(
            "clear_job_meta",
            lambda: self.connection.hset(job.key, "meta", json.dumps(cleaned)),
        )

    def _cover_deadline(self, job: Job, check: JobCheck) -> None:
        """Set rq's timeout to the task's effective deadline plus grace (trap 2).

        The tightest of the agent's (cached definition) and the task's max_duration_s,
        or what is left of a re-run task's deadline; lowered as well as raised.
        """
        needed = math.ceil(DEFAULT_MAX_DURATION_S + self._timeout_grace_s)
        if check.task is not None:
            try:
                task = parse_task(check.task)
                needed = run_timeout_s(
                    self.connection,
                    task,
                    grace_s=self._timeout_grace_s,
                    agents=self._agent_store(),
                )
            except InvalidTask:
                self._final_job_ids.add(job.id)
        if job.timeout != needed:
            job.timeout = needed
            self._until_redis_answers(
                "set_job_timeout", lambda: self.connection.hset(job.key, "timeout", needed)
            )

    def _agent_store(self) -> AgentStore:
        """Definitions as the job reads them, for the rq timeout of the agent's tasks."""
        if self._agents is None:
            config = settings_or_exit()
            self._agents = AgentStore(
                config.agents_dir, redis=self.connection, ttl_s=config.agent_cache_ttl_s
            )
        return self._agents

    def _allow_crash_reruns(self, job: Job, check: JobCheck) -> None:
        """Give a valid agent task ``crash_reruns`` retries unless its producer chose its own."""
        if (
            check.function != JOB_FUNCTION
            or check.task is None
            or job.id in self._final_job_ids  # an invalid task fails the same way every time
            or job.retries_left is not None
        ):
            return
        job.retries_left = self.crash_reruns
        self._until_redis_answers(
            "set_job_retries",
            lambda: self.connection.hset(job.key, "retries_left", self.crash_reruns),
        )

    def handle_work_horse_killed(
        self, job: Job, retpid: int | None, ret_val: int | None, rusage: Any
    ) -> None:
        # Called by rq before it fails (or retries) the job of a job process that died.
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)  # type: ignore[no-untyped-call]
        if ret_val is not None and not os.WIFSIGNALED(ret_val):
            # It exited on its own, its failure handling broken by the job itself (a job
            # hash rq cannot save, say): a crash re-run would fail the same way.
            self._final_job_ids.add(job.id)
        if retpid:
            self._release_dead_job_lease(job.id, retpid)

    def _release_dead_job_lease(self, job_id: str, pid: int) -> None:
        """The dead job process cannot release its task lease: do it, so the re-run can start."""
        if self._until_redis_answers(
            "release_lease", lambda: release_lease_of(self.connection, job_id, pid)
        ):
            log_event("dead_job_lease_released", level="warning", task_id=job_id, pid=pid)

    def _hand_back_after_cold_shutdown(self, job: Job, queue: Queue) -> None:
        """Put a task killed by a cold shutdown back now (a retry, resuming from its checkpoint).

        rq leaves such a job in the started registry, and only maintenance run after
        its heartbeat expired (a minute or more) would retry it.
        """
        execution = next((e for e in self.executions.values() if e.job_id == job.id), None)
        try:
            if self.horse_pid:
                release_lease_of(self.connection, job.id, self.horse_pid)
            if job.get_status(refresh=True) is not JobStatus.STARTED:
                return  # it ended just before the job process was killed
            self.handle_job_failure(
                job,
                queue,
                exc_string="job process killed by a cold shutdown of the worker",
                execution=execution,
            )
        except RedisError as exc:
            # Shutting down: rq's abandoned-job cleanup will retry it instead.
            log_event(
                "cold_shutdown_hand_back_failed", level="error", job_id=job.id, error=str(exc)
            )
            return
        log_event("task_handed_back", level="warning", task_id=job.id, reason="cold shutdown")

    def _after_job(self, job: Job, check: JobCheck) -> None:
        self._until_redis_answers(
            "apply_job_metrics", lambda: apply_job_metrics(self.connection, job.id)
        )
        self._until_redis_answers(
            "kill_child_processes", lambda: kill_recorded_process_groups(self.connection, job.id)
        )
        self._requeue_if_asked(job, check.task)

    def _requeue_if_asked(self, job: Job, task: dict[str, Any] | None) -> None:
        """Put the same task back with a delay when the job set ``meta["requeue"]``."""
        try:
            meta = self._until_redis_answers("read_job_meta", lambda: job.get_meta(refresh=True))
        except ValueError:
            return
        request = meta.get("requeue") if isinstance(meta, dict) else None
        if not isinstance(request, dict) or task is None:
            return
        try:
            delay_s = float(request.get("delay_s", 0))
            attempt = int(request.get("attempt", 0))
            result = self._until_redis_answers(
                "requeue_task",
                lambda: enqueue_task(
                    self.connection,
                    task,
                    queue_name=job.origin,
                    result_ttl_s=job.result_ttl or self._result_ttl_s,
                    timeout_grace_s=self._timeout_grace_s,
                    delay_s=delay_s,
                    attempt=attempt,
                ),
            )
        except (InvalidTask, TypeError, ValueError) as exc:
            log_event("task_requeue_failed", level="error", task_id=job.id, error=str(exc))
            return
        log_event(
            "task_reenqueued",
            task_id=job.id,
            delay_s=delay_s,
            attempt=attempt,
            status=result.status,
        )

    # -- jobs that must not run ------------------------------------------------------------

    def _fail_without_running(self, job: Job, queue: Queue, check: JobCheck) -> None:
        """Fail a refused or undecodable job in the parent: nothing imported, nothing forked."""
        event = "job_refused" if check.verdict is Verdict.REFUSED else "job_undecodable"
        log_event(event, level="error", job_id=job.id, queue=queue.name, reason=check.reason)
        if check.verdict is Verdict.UNDECODABLE:
            worker_metrics().jobs_undecodable.inc()
        self._final_job_ids.add(job.id)
        try:
            self._until_redis_answers(
                "fail_job", lambda: self.handle_job_failure(job, queue, exc_string=check.reason)
            )
            self._until_redis_answers(
                "drop_job", lambda: self._drop_from_intermediate(queue, job.id)
            )
        finally:
            self._final_job_ids.discard(job.id)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        wait_s = 1.0
        while True:
            try:
                result: tuple[Job, Queue] | None = super().dequeue_job_and_maintain_ttl(
                    timeout, max_idle_time
                )
                return result
            except Exception as exc:
                if is_redis_outage(exc):
                    # rq's own loop rides out only a lost connection; a refused BLMOVE (OOM,
                    # READONLY) would end the worker ("unhandled exception, quitting").
                    self._note_outage("dequeue", exc, retry_in_s=wait_s)
                    time.sleep(wait_s)
                    wait_s = min(
                        wait_s * self.exponential_backoff_factor, self.max_connection_wait_time
                    )
                    continue
                # rq tags a job hash it cannot even load with its id and queue; without
                # this the parent would quit on one garbage hash (trap 4).
                job_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if not isinstance(job_id, str) or not isinstance(queue, Queue):
                    raise
                self._fail_unloadable(job_id, queue, exc)

    def _fail_unloadable(self, job_id: str, queue: Queue, exc: Exception) -> None:
        reason = f"job hash cannot be loaded by rq: {type(exc).__name__}: {exc}"
        log_event("job_undecodable", level="error", job_id=job_id, queue=queue.name, reason=reason)
        worker_metrics().jobs_undecodable.inc()
        failed_registry = FailedJobRegistry(queue=queue)

        def record_failure() -> None:
            with self.connection.pipeline(transaction=True) as pipe:
                pipe.hset(
                    Job.key_for(job_id),
                    mapping={
                        "status": JobStatus.FAILED.value,
                        "exc_info": reason,
                        "ended_at": utcformat(now()),
                    },
                )
                pipe.zadd(failed_registry.key, {job_id: current_timestamp() + DEFAULT_FAILURE_TTL})
                pipe.lrem(queue.intermediate_queue_key, 1, job_id)
                pipe.execute()

        self._until_redis_answers("fail_job", record_failure)

    def _drop_from_intermediate(self, queue: Queue, job_id: str) -> None:
        # rq's job process removes it when the job starts; a job that never starts must too.
        self.connection.lrem(queue.intermediate_queue_key, 1, job_id)

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: Any = None,
        exc_string: str = "",
        execution: Execution | None = None,
    ) -> None:
        if job.retries_left and self._must_not_retry(job):
            job.retries_left = 0
        super().handle_job_failure(
            job,
            queue,
            started_job_registry=started_job_registry,
            exc_string=exc_string,
            execution=execution,
        )

    def _finalize_failure(
        self, job: Job, queue: Queue, execution: Execution, exc_info: Any
    ) -> None:
        # In the job process. A copy whose lease another copy took stops without touching
        # the job: its status, retries and report belong to the copy that holds the lease.
        if isinstance(exc_info[1], LeaseLost):
            log_event("task_lease_lost", level="warning", task_id=job.id, reason=str(exc_info[1]))
            # Only this copy's own execution record goes, or rq would call it abandoned.
            with self.connection.pipeline() as pipe:
                self.cleanup_execution(job, pipe, execution)
                pipe.execute()
            return
        super()._finalize_failure(job, queue, execution, exc_info)

    def _must_not_retry(self, job: Job) -> bool:
        if job.id in self._final_job_ids:
            return True
        try:
            report = job.get_meta(refresh=True).get("report")
        except (RedisError, ValueError):
            return False
        return isinstance(report, dict) and report.get("outcome") in self.never_retried_outcomes

    # -- our own Redis housekeeping (maintenance; outages are ridden out around it) --------

    def maintain_own_data(self) -> None:
        sweep_job_metrics(self.connection, older_than_s=self.metrics_sweep_after_s)
        drain_outbox_now(self.connection)


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
