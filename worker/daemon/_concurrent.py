"""Several agent tasks at once in one worker process (WORKER_CONCURRENCY above 1).

An agent task spends nearly all its time waiting for the model, and a forked job
process per task costs memory, not CPU. With ``WORKER_CONCURRENCY=N`` the worker runs
up to N jobs in threads of its own process, each task in its own event loop:

    main thread   rq's loop: dequeue, vet (as ever), prepare the job's execution,
                  hand it to a job thread, wait for a free slot; maintenance, the
                  scheduler, suspension and signals stay rq's
    job thread    rq's ``perform_job`` (results, retries, the failed registry: rq's
                  own bookkeeping), then the after-job steps of that job alone
    heartbeats    one thread keeps the worker key and every in-flight execution alive
                  each ``job_monitoring_interval``: if the process dies, each execution
                  expires on its own and rq's maintenance re-runs it from its checkpoint

A first SIGTERM stops dequeuing and lets every task in flight finish; a second one hands
every task in flight back at once (a crash re-run, from its checkpoint), then exits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import BaseDeathPenalty, TimerDeathPenalty, UnixSignalDeathPenalty

from worker.coordination import in_process_run, request_cancel
from worker.daemon._one_job import VettingWorker
from worker.daemon._vetting import JobCheck
from worker.logs import log_event
from worker.redis_io import share_between_threads
from worker.settings import settings_or_exit

# How often a wait for a job thread wakes up to let the main thread handle signals.
_WAIT_SLICE_S = 1.0
# Redis connections a task may hold at once (its job thread, its task-lease renewal, its
# agent-slot renewal), and those of the worker itself (main thread, heartbeats, rq's
# pubsub, metrics, outbox).
_CONNECTIONS_PER_TASK = 3
_WORKER_CONNECTIONS = 16


@dataclass(frozen=True)
class InFlightJob:
    """A job handed to a job thread; its execution id names the run (and its task lease)."""

    job: Job
    queue: Queue
    execution: Execution


class ConcurrentWorker(VettingWorker):
    """The vetting worker running up to ``concurrency`` jobs at once in job threads.

    With ``concurrency`` 1 (the default) nothing changes: rq forks a job process per job.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        super().__init__(*args, **kwargs)
        self.concurrency = 1  # WORKER_CONCURRENCY, read at start (bootstrap)
        # Jobs in job threads by execution id, guarded by the condition's lock; the main
        # thread waits on it for a free slot, teardown for the last job.
        self._in_flight: dict[str, InFlightJob] = {}
        self._job_ended = threading.Condition()
        self._waiting_for_job = False
        self._cold_shutdown = False
        self._heartbeats: threading.Thread | None = None
        self._heartbeats_stopped = threading.Event()

    @property
    def concurrent(self) -> bool:
        return self.concurrency > 1

    @property
    def death_penalty_class(self) -> type[BaseDeathPenalty]:  # type: ignore[override]
        # rq's SIGALRM timeout reaches only the main thread: a job thread gets rq's timer,
        # which raises the timeout in that thread (only a backstop: the task's deadline is
        # enforced inside, trap 8).
        if threading.current_thread() is threading.main_thread():
            return UnixSignalDeathPenalty
        return TimerDeathPenalty

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        self.concurrency = settings_or_exit().worker_concurrency
        self._size_connection_pool()
        super().bootstrap(*args, **kwargs)

    def _size_connection_pool(self) -> None:
        """Let every thread that may hold a Redis connection have one, and more wait.

        redis-py's plain pool refuses a connection past ``max_connections`` (100 by default)
        with "Too many connections": 500 tasks in one process failed a fifth of their runs so.
        """
        needed = self.concurrency * _CONNECTIONS_PER_TASK + _WORKER_CONNECTIONS
        share_between_threads(self.connection, max_connections=needed)

    # -- handing jobs over -----------------------------------------------------------------

    def run_vetted_job(self, job: Job, queue: Queue, check: JobCheck) -> None:
        if not self.concurrent:
            super().run_vetted_job(job, queue, check)
            return
        execution = self.prepare_execution(job)
        flight = InFlightJob(job=job, queue=queue, execution=execution)
        with self._job_ended:
            self._in_flight[execution.id] = flight
        self._start_heartbeats()
        threading.Thread(
            target=self._run_in_thread, args=(flight, check), name=f"job {job.id}", daemon=True
        ).start()
        self._wait_while(lambda: len(self._in_flight) >= self.concurrency)

    def _run_in_thread(self, flight: InFlightJob, check: JobCheck) -> None:
        """One job in a job thread: rq's perform_job, then that job's after-job steps."""
        job, execution = flight.job, flight.execution
        try:
            with self._bookkeeping_ridden_out(job), in_process_run(execution.id):
                self.perform_job(job, flight.queue, execution)
            self._after_job(job, check, execution.id)
        except Exception as exc:
            # The thread must still free its slot; rq's maintenance settles the job.
            log_event("job_thread_failed", level="error", job_id=job.id, error=repr(exc))
        finally:
            # rq's cleanup drops it on success and failure; an outage may have stopped it.
            self.executions.pop(execution.id, None)
            with self._job_ended:
                self._in_flight.pop(execution.id, None)
                self._job_ended.notify_all()

    def _wait_while(self, busy: Callable[[], bool]) -> None:
        """Block the main thread while ``busy()`` holds, waking up for signals."""
        with self._job_ended:
            while busy():
                self._job_ended.wait(_WAIT_SLICE_S)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        if not self.concurrent:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        while True:
            self._waiting_for_job = True
            try:
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            finally:
                self._waiting_for_job = False
            if result is not None or timeout is not None or not self._in_flight:
                return result
            # A burst worker stops at an empty queue, but a job in flight may still put
            # its task back (a retry, a requeue): look again once one of them ended.
            self._wait_for_a_job_to_end()
            if self._stop_requested:
                return None  # a warm shutdown came meanwhile: take nothing more

    def _wait_for_a_job_to_end(self) -> None:
        in_flight = len(self._in_flight)  # nothing is handed over meanwhile: only ends count
        self._wait_while(lambda: len(self._in_flight) == in_flight)

    # -- heartbeats ------------------------------------------------------------------------

    def _start_heartbeats(self) -> None:
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(
                target=self._keep_in_flight_alive, name="heartbeats", daemon=True
            )
            self._heartbeats.start()

    def _keep_in_flight_alive(self) -> None:
        """rq's per-job heartbeat (worker key, execution, job) for every job in flight."""
        while not self._heartbeats_stopped.wait(self.job_monitoring_interval):
            with self._job_ended:
                in_flight = list(self._in_flight.values())
            for flight in in_flight:
                try:
                    self.maintain_heartbeats(flight.job, flight.execution)
                except Exception as exc:
                    # Outages are ridden out inside; anything else must not end the thread.
                    log_event(
                        "heartbeat_failed", level="error", job_id=flight.job.id, error=repr(exc)
                    )

    # -- stopping --------------------------------------------------------------------------

    def _shutdown(self) -> None:
        if self.concurrent and not self._waiting_for_job:
            # Between a dequeue and its hand-over, or waiting for a free slot: rq's loop
            # stops at its next check, and teardown waits for the jobs in flight.
            self._stop_requested = True
            self.set_shutdown_requested_date()  # type: ignore[no-untyped-call]
            return
        super()._shutdown()  # type: ignore[no-untyped-call]

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        try:
            super().request_force_stop(signum, frame)
        except SystemExit:
            if self.concurrent:
                self._cold_shutdown = True
                self._hand_back_in_flight()
            raise

    def _hand_back_in_flight(self) -> None:
        with self._job_ended:
            in_flight = list(self._in_flight.values())
        for flight in in_flight:
            self._hand_back_after_cold_shutdown(
                flight.job,
                flight.queue,
                flight.execution,
                lease_pid=os.getpid(),
                run_id=flight.execution.id,
            )

    def request_stop_execution(self, execution_id: str) -> None:
        # rq's `stop-job` kills the job process; a job thread cannot be killed: its task
        # is cancelled instead and stops at its next step.
        flight = self._in_flight.get(execution_id)
        if not self.concurrent or flight is None:
            super().request_stop_execution(execution_id)
            return
        request_cancel(self.connection, flight.job.id)
        log_event("task_stop_requested", task_id=flight.job.id, execution=execution_id)

    def teardown(self) -> None:
        try:
            if self.concurrent and not self._cold_shutdown and self._in_flight:
                log_event("waiting_for_tasks", worker=self.name, in_flight=len(self._in_flight))
                self._wait_while(lambda: bool(self._in_flight) and not self._cold_shutdown)
        finally:
            self._heartbeats_stopped.set()
            super().teardown()  # type: ignore[no-untyped-call]
