"""rq's Worker riding out Redis outages and refused writes (trap 3).

rq's own loop survives a lost connection only while idle: a Redis restart, a full
Redis (``OOM`` under ``noeviction``), a primary turned replica (``READONLY``) or a
server still loading (``LOADING``) anywhere else ends the worker ("unhandled
exception, quitting"). Here every Redis call of the worker parent outside a job is
either retried until Redis answers (what must happen: starting the scheduler, the
suspension check, preparing an execution) or skipped (what repeats anyway: heartbeats,
state, maintenance; and the stop request's date, only a record). Each wait logs
``redis_unavailable`` with its ``kind`` and counts ``agent_redis_unavailable_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, RedisError
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.executions import Execution
from rq.job import Job
from rq.scheduler import RQScheduler
from rq.worker import Worker

from worker.logs import log_event
from worker.metrics import worker_metrics
from worker.redis_io import PatientRetry, is_redis_outage, outage_kind, until_redis_answers

T = TypeVar("T")


class OutageQuietScheduler(RQScheduler):
    """rq's scheduler process: it rides out a Redis restarted under it, stops without
    waiting for Redis, and ends with one log line when Redis is gone.

    rq's scheduler process raises out of its loop when Redis stays away longer than
    the connection's retry, and then both rq and ``multiprocessing`` write the raw
    traceback into the JSON log stream. Here it ends cleanly with one
    ``scheduler_stopped`` event instead; the worker's loop starts a new one once
    Redis answers (rq's ``acquire_locks(auto_start=True)``), as it did before.
    """

    def request_stop(self, signum: Any = None, frame: Any = None) -> None:
        # Its worker is stopping and waits for this process. A command waiting out an
        # outage (REDIS_PATIENCE_S) would hold the worker that long: it fails at its next
        # attempt instead, and the lock it could not release expires on its own.
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]
        retry = self.connection.get_retry()
        if isinstance(retry, PatientRetry):
            retry.stop_waiting()

    def heartbeat(self) -> None:
        # rq renews its locks by running its lock script in a transaction. redis-py asks
        # the server for the script before sending the transaction, not again when the
        # connection's retry sends it once more: a Redis restarted in between (it forgot
        # every script) fails it with NoScriptError. The same heartbeat again loads the
        # script first; it only renews, so running it twice is harmless.
        try:
            super().heartbeat()  # type: ignore[no-untyped-call]
        except NoScriptError:
            log_event("redis_scripts_lost", level="warning", during="scheduler_heartbeat")
            super().heartbeat()  # type: ignore[no-untyped-call]

    def work(self) -> None:
        try:
            super().work()  # type: ignore[no-untyped-call]
        except RedisError as exc:
            if not is_redis_outage(exc):
                raise
            log_event(
                "scheduler_stopped",
                level="warning",
                reason="redis_unavailable",
                kind=outage_kind(exc),
                error=str(exc),
            )


class OutageTolerantWorker(Worker):
    """A Worker whose parent process never quits because Redis is gone or refuses writes."""

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # A missed heartbeat costs nothing: the worker key lives for minutes.
        with self._skipped_in_an_outage("heartbeat"):
            super().heartbeat(timeout, pipeline)

    def maintain_heartbeats(self, job: Job, execution: Execution) -> None:
        with self._skipped_in_an_outage("maintain_heartbeats"):
            super().maintain_heartbeats(job, execution)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        with self._skipped_in_an_outage("set_state"):
            super().set_state(state, pipeline)

    def set_shutdown_requested_date(self) -> None:
        # rq writes it from the stop signal's handler: an outage raised there lands in
        # whatever the main thread was doing (a sleep between retries, say) and ends the
        # worker with "unhandled exception, quitting" and a traceback. It is only a record.
        with self._skipped_in_an_outage("set_shutdown_requested_date"):
            super().set_shutdown_requested_date()  # type: ignore[no-untyped-call]

    def _start_scheduler(
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        # rq calls this once, outside its loop: an outage here would end the worker.
        # rq's own body, with the scheduler class below in place of RQScheduler.
        def start() -> None:
            self.scheduler = OutageQuietScheduler(
                self.queues,
                connection=self.connection,
                logging_level=logging_level if logging_level is not None else self.log.level,
                date_format=date_format,
                log_format=log_format,
                serializer=self.serializer,
            )
            self.scheduler.acquire_locks()  # type: ignore[no-untyped-call]
            if not self.scheduler.acquired_locks:
                return
            if not burst:
                self.scheduler.start()  # type: ignore[no-untyped-call]
                return
            try:
                self.scheduler.register_birth()
                self.scheduler.enqueue_scheduled_jobs()  # type: ignore[no-untyped-call]
            finally:
                self.scheduler.release_locks()  # type: ignore[no-untyped-call]
                self.scheduler.register_death()

        self._until_redis_answers("start_scheduler", start)

    def check_for_suspension(self, burst: bool) -> None:
        parent_check = super().check_for_suspension
        self._until_redis_answers("check_for_suspension", lambda: parent_check(burst))

    def prepare_execution(self, job: Job) -> Execution:
        parent_prepare = super().prepare_execution

        def prepare() -> Execution:
            known = set(self.executions)
            try:
                execution: Execution = parent_prepare(job)
            except RedisError:
                # Forget the half-made execution before the next attempt makes another.
                for execution_id in set(self.executions) - known:
                    self.executions.pop(execution_id, None)
                raise
            return execution

        return self._until_redis_answers("prepare_execution", prepare)

    def run_maintenance_tasks(self) -> None:
        with self._skipped_in_an_outage("maintenance"):
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]
            self.maintain_own_data()

    def _until_redis_answers(self, during: str, action: Callable[[], T]) -> T:
        """Run ``action``, waiting out a Redis outage (or refusal) with exponential backoff."""
        return until_redis_answers(
            during,
            action,
            max_wait_s=self.max_connection_wait_time,
            on_outage=lambda _, exc: worker_metrics().redis_unavailable(outage_kind(exc)),
        )

    @contextmanager
    def _skipped_in_an_outage(self, during: str) -> Iterator[None]:
        """What repeats anyway or is only a record, skipped (and noted) while Redis is away;
        any other Redis error is raised."""
        try:
            yield
        except RedisError as exc:
            if not is_redis_outage(exc):
                raise
            self._note_outage(during, exc)

    def _note_outage(self, during: str, exc: BaseException, **fields: Any) -> None:
        """A wait for Redis the worker rides out: one log event and one count."""
        kind = outage_kind(exc)
        worker_metrics().redis_unavailable(kind)
        log_event(
            "redis_unavailable", level="warning", during=during, kind=kind, error=str(exc), **fields
        )

    def maintain_own_data(self) -> None:
        """Redis housekeeping of a subclass, run with rq's maintenance (outages ridden out)."""
