"""One job as the worker runs it: vetted before anything runs, settled after.

    check the raw job against the allow-list   (refuse or fail it, never import it)
    drop a producer's meta.requeue/report      (only the job itself sets them)
    make sure rq's timeout covers the deadline (rq's kill is only a backstop)
    give an agent task its crash re-runs       (rq retries a killed or abandoned job)
    run it                                     (rq's fork and monitor, or a job thread)
    apply the metrics and export the spans     (a job process hands them over in Redis;
      a job process handed over                 a job thread adds them as it runs)
    kill process groups the job left behind
    re-enqueue the task if the job asked for it

``run_vetted_job`` is the one step a subclass changes (``JobThreadsWorker`` runs the job
in a thread of the worker process instead of rq's forked job process).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from redis.exceptions import RedisError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue

from worker.agents import AgentStore
from worker.coordination import LeaseLost, release_lease_of
from worker.daemon._job_timeout import run_timeout_s
from worker.daemon._unloadable import UnloadableJobsWorker
from worker.daemon._vetting import (
    JOB_CONTROL_FIELDS,
    JobCheck,
    Verdict,
    check_job,
    producer_control_fields,
)
from worker.enqueue import (
    DEFAULT_MAX_DURATION_S,
    DEFAULT_RESULT_TTL_S,
    DEFAULT_TIMEOUT_GRACE_S,
    JOB_FUNCTION,
    enqueue_task,
)
from worker.exceptions import InvalidTask
from worker.logs import log_event
from worker.metrics import apply_job_metrics, worker_metrics
from worker.redis_io import (
    CappedJob,
    is_redis_outage,
    kill_recorded_process_groups,
    recording_children_of,
)
from worker.settings import settings_or_exit
from worker.task import Outcome, parse_task
from worker.tracing import deliver_job_spans


class VettingWorker(UnloadableJobsWorker):
    """rq's forking Worker, vetting every job before it runs and settling it after."""

    allowed_functions: ClassVar[frozenset[str]] = frozenset({JOB_FUNCTION})
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        super().__init__(*args, **kwargs)
        self._timeout_grace_s: int = DEFAULT_TIMEOUT_GRACE_S
        self._result_ttl_s: int = DEFAULT_RESULT_TTL_S
        # Jobs whose failure must not be retried; a forked job process inherits it. Read and
        # written from job threads too: single set operations, atomic under the GIL.
        self._final_job_ids: set[str] = set()
        self._agents: AgentStore | None = None  # made on first use, never in __init__
        # The execution of the job in rq's forked job process (one at a time), for its clean-up.
        self._forked_execution_id: str | None = None

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
        self.run_vetted_job(job, queue, check)

    def run_vetted_job(self, job: Job, queue: Queue, check: JobCheck) -> None:
        """Run a job that passed vetting and settle it: here in rq's forked job process."""
        self._forked_execution_id = None
        with self._bookkeeping_ridden_out(job):
            try:
                super().execute_job(job, queue)
            except SystemExit:
                # rq's cold shutdown (a second SIGTERM/SIGINT) killed the job process.
                execution = next((e for e in self.executions.values() if e.job_id == job.id), None)
                self._hand_back_after_cold_shutdown(job, queue, execution, lease_pid=self.horse_pid)
                deliver_job_spans(self.connection, job.id)  # exported as the worker stops
                raise
        self._take_job_process_handover(job)
        self._after_job(job, check, self._forked_execution_id)

    def _take_job_process_handover(self, job: Job) -> None:
        """What a forked job process left its worker in Redis: its metrics and its spans (a
        job thread hands neither over: it adds them to the worker's own as it runs)."""
        self._until_redis_answers(
            "apply_job_metrics", lambda: apply_job_metrics(self.connection, job.id)
        )
        deliver_job_spans(self.connection, job.id)

    def prepare_execution(self, job: Job) -> Execution:
        execution = super().prepare_execution(job)
        self._forked_execution_id = execution.id  # read only with one job at a time (forked)
        return execution

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        # In the job process or job thread: the processes the job starts belong to this run.
        with recording_children_of(execution.id):
            performed: bool = super().perform_job(job, queue, execution)
        return performed

    @contextmanager
    def _bookkeeping_ridden_out(self, job: Job) -> Iterator[None]:
        """Around one run of a job: rq's bookkeeping failing on an outage is logged, not fatal."""
        try:
            yield
        except RedisError as exc:
            if not is_redis_outage(exc):
                raise
            # Only rq's bookkeeping around the run can raise here; the job stays in
            # the started registry and rq's maintenance settles it.
            log_event("job_bookkeeping_failed", level="error", job_id=job.id, error=str(exc))
        finally:
            self._final_job_ids.discard(job.id)

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

    def _hand_back_after_cold_shutdown(
        self,
        job: Job,
        queue: Queue,
        execution: Execution | None,
        *,
        lease_pid: int,
        run_id: str | None = None,
        why: str = "job process killed by a cold shutdown of the worker",
    ) -> None:
        """Put a task stopped by a cold shutdown back now (a retry, resuming from its checkpoint).

        rq leaves such a job in the started registry, and only maintenance run after
        its heartbeat expired (a minute or more) would retry it. ``lease_pid`` (and
        ``run_id`` for a run in a job thread) name the run whose task lease is freed;
        ``why`` is the reason rq records (also for a job thread given up past its timeout).
        """
        try:
            if lease_pid:
                release_lease_of(self.connection, job.id, lease_pid, run_id)
            if job.get_status(refresh=True) is not JobStatus.STARTED:
                return  # it ended just before the cold shutdown
            self.handle_job_failure(job, queue, exc_string=why, execution=execution)
        except RedisError as exc:
            # Shutting down: rq's abandoned-job cleanup will retry it instead.
            log_event(
                "cold_shutdown_hand_back_failed", level="error", job_id=job.id, error=str(exc)
            )
            return
        log_event("task_handed_back", level="warning", task_id=job.id, reason=why)

    def _after_job(self, job: Job, check: JobCheck, execution_id: str | None) -> None:
        self._until_redis_answers(
            "kill_child_processes",
            lambda: kill_recorded_process_groups(self.connection, job.id, execution_id),
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
                    rerun=True,  # the run that asked for it has just finished
                    requeue_reason=str(request.get("reason") or "") or None,
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
            worker_metrics().job_undecodable()
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
