"""Several agent tasks at once in one worker process (WORKER_CONCURRENCY above 1).

rq keeps a mode a class (``Worker`` forks, ``SimpleWorker`` runs in place); so does the
worker: ``AgentWorker`` forks a job process per job, and with a concurrency above 1 it
is built as its threaded variant, ``JobThreadsWorker`` under it (``threaded_variant``).

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
every task in flight back at once (a crash re-run, from its checkpoint), then exits. The
signal handlers only raise or record the stop (``worker.daemon._stopping``); the hand-back
runs in teardown.

rq's private members overridden here (docs/contract.md, trap 19) say so in their
docstrings: ``rq override: Worker.<name>``.

A thread cannot be killed: what rq does to a job process is done to a run instead
(``worker.daemon._job_threads``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from rq.command import parse_payload
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import BaseDeathPenalty, UnixSignalDeathPenalty
from rq.utils import now

from worker._signals import signals_left_to_the_main_thread
from worker.coordination import (
    in_process_run,
    request_cancel,
    revoke_in_process_run,
    run_is_revoked,
)
from worker.daemon._job_threads import (
    InFlightJob,
    JobThreadDeathPenalty,
    RunStop,
    outcome_of,
    size_connection_pool,
)
from worker.daemon._stopping import Shutdown, StopSignalsWorker
from worker.daemon._vetting import JobCheck
from worker.logs import log_event
from worker.settings import settings_or_exit
from worker.task import Outcome

# How often a wait for a job thread wakes up to let the main thread handle signals.
_WAIT_SLICE_S = 1.0
# The longest the main thread blocks on the queue while a run is in flight (whole seconds:
# rq's blocking pop takes an int), for the same reason.
_LOOK_SLICE_S = 1
# How long a hand-back waits for a run that is settling its job right now to finish.
_SETTLING_WAIT_S = 10.0
# The exit status of a worker that gave up on a run stuck past its timeout.
EXIT_RUN_ABANDONED = 1
# What rq's Worker.get_heartbeat_ttl adds to the job monitoring interval.
_RQ_HEARTBEAT_GRACE_S = 60


class JobThreadsWorker(StopSignalsWorker):
    """The vetting worker running up to ``concurrency`` jobs at once in job threads.

    It is a mode, as rq's ``SimpleWorker`` is: a worker class builds it under itself
    (``threaded_variant``) when its host runs more than one task at once.
    """

    # Tasks at once: WORKER_CONCURRENCY (or the pool's), read at start (bootstrap).
    concurrency: int = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        super().__init__(*args, **kwargs)
        # Jobs in job threads by execution id, guarded by the condition's lock; the main
        # thread waits on it for a free slot, teardown for the last job.
        self._in_flight: dict[str, InFlightJob] = {}
        self._job_ended = threading.Condition()
        self._runs_ended = 0  # ever: a burst worker's empty look counts only if none ended since
        self._heartbeats: threading.Thread | None = None
        self._heartbeats_stopped = threading.Event()
        # rq keeps one "stopped job" for the worker; job threads settle theirs one at a time.
        self._settling_stopped_job = threading.Lock()

    @property
    def death_penalty_class(self) -> type[BaseDeathPenalty]:  # type: ignore[override]
        """rq override: ``Worker.death_penalty_class``. rq's SIGALRM timeout reaches only the
        main thread: a job thread gets rq's timer, which raises the timeout in that thread
        (only a backstop: the task's deadline is enforced inside, trap 8)."""
        if threading.current_thread() is threading.main_thread():
            return UnixSignalDeathPenalty
        return JobThreadDeathPenalty

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """rq override: ``Worker.get_heartbeat_ttl``. rq's TTL shrinks to the time left
        before the timeout and goes negative past it (a job process is killed by then); a
        run past its timeout stays alive until it is handed back, so its execution must
        never look expired while it runs."""
        ttl: int = super().get_heartbeat_ttl(job, working_time)
        return max(ttl, int(self.job_monitoring_interval) + _RQ_HEARTBEAT_GRACE_S)

    def configured_concurrency(self) -> int:
        """Tasks at once, read at start: WORKER_CONCURRENCY (AgentWorker asks its host)."""
        return settings_or_exit().worker_concurrency

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """rq override: ``Worker.bootstrap``, first sizing the Redis pool for every thread."""
        self.concurrency = self.configured_concurrency()
        size_connection_pool(self.connection, self.concurrency)
        super().bootstrap(*args, **kwargs)

    def has_runs_in_flight(self) -> bool:
        return bool(self._in_flight)

    # -- handing jobs over -----------------------------------------------------------------

    def run_vetted_job(self, job: Job, queue: Queue, check: JobCheck) -> None:
        """Run a job that passed vetting in a job thread; wait for a free slot."""
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
            if not run_is_revoked(execution.id):
                self._after_job(job, check, execution.id)
        except Exception as exc:
            # The thread must still free its slot; rq's maintenance settles the job.
            log_event("job_thread_failed", level="error", job_id=job.id, error=repr(exc))
        finally:
            self._end_flight(execution.id)

    def _end_flight(self, execution_id: str) -> None:
        # rq's cleanup drops it on success and failure; an outage may have stopped it.
        self.executions.pop(execution_id, None)
        with self._job_ended:
            self._in_flight.pop(execution_id, None)
            self._runs_ended += 1
            self._job_ended.notify_all()

    # -- settling a run: fenced once handed back; STOPPED when rq asked to stop it ---------

    def _finalize_success(
        self, job: Job, queue: Queue, execution: Execution, return_value: Any
    ) -> None:
        """rq override: ``Worker._finalize_success``. A run handed back is fenced off; a run
        rq's stop-job cancelled settles STOPPED, as its killed job process would."""
        with self._settling(execution) as flight:
            if flight is None:
                return
            if RunStop.ASKED in flight.stop and outcome_of(return_value) == Outcome.CANCELLED:
                self._settle_stopped(job, queue, execution)
                return
            super()._finalize_success(job, queue, execution, return_value)

    def _finalize_failure(
        self, job: Job, queue: Queue, execution: Execution, exc_info: Any
    ) -> None:
        """rq override: ``Worker._finalize_failure``, fenced off once the run is handed back."""
        with self._settling(execution) as flight:
            if flight is not None:
                super()._finalize_failure(job, queue, execution, exc_info)

    @contextmanager
    def _settling(self, execution: Execution) -> Iterator[InFlightJob | None]:
        """Settle a run's job only while it is still this run's: None once handed back."""
        flight = self._in_flight.get(execution.id)
        if flight is None or run_is_revoked(execution.id):
            log_event("handed_back_run_fenced", level="warning", execution=execution.id)
            yield None
            return
        with flight.settling:
            if run_is_revoked(execution.id):
                log_event("handed_back_run_fenced", level="warning", execution=execution.id)
                yield None
            else:
                yield flight

    def _settle_stopped(self, job: Job, queue: Queue, execution: Execution) -> None:
        """What rq does with a job process stop-job killed: STOPPED, never retried.

        Sets rq's private ``Worker._stopped_job_id`` (read by ``handle_job_failure``) and
        calls ``Worker._handle_stopped_job``, as rq's job-process path does."""
        job.ended_at = now()
        with self._settling_stopped_job:
            self._stopped_job_id = job.id
            self._handle_stopped_job(job, queue, execution)

    def _wait_while(self, busy: Callable[[], bool]) -> None:
        """Block the main thread while ``busy()`` holds, waking up for signals."""
        with self._job_ended:
            while busy():
                self._job_ended.wait(_WAIT_SLICE_S)
                self._act_on_stop_signal()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """rq override: ``Worker.dequeue_job_and_maintain_ttl``, looking in slices while a
        run is in flight, and a burst worker stopping only once no run can requeue."""
        idle_until = None if max_idle_time is None else time.monotonic() + max_idle_time
        while True:
            runs_ended = self._runs_ended
            # Python runs a signal handler in the main thread, but the kernel may hand the
            # signal to a busy job thread: the main thread's blocking look at the queue is
            # then not interrupted, and a SIGTERM would wait out the whole look (60 s).
            # While a run is in flight the main thread looks in slices instead.
            sliced = timeout is not None and bool(self._in_flight)
            if sliced:
                idle_left: int | None = _LOOK_SLICE_S
            elif idle_until is not None:
                idle_left = max(1, math.ceil(idle_until - time.monotonic()))
            else:
                idle_left = None
            result = super().dequeue_job_and_maintain_ttl(timeout, idle_left)
            if result is not None:
                return result
            if timeout is not None:
                # A slice ran out (look again), or the operator's max idle time did (stop).
                idle_over = idle_until is not None and time.monotonic() >= idle_until
                if not sliced or idle_over or self._stop_requested:
                    return None
                continue
            # A burst worker stops at an empty queue, but a job in flight may still put its
            # task back (a retry, a requeue): an empty look counts only when no run was in
            # flight then and none ended since (one may have ended between the look and now).
            if self._runs_ended == runs_ended:
                if not self._in_flight:
                    return None
                self._wait_for_a_run_to_end(since=runs_ended)
            if self._stop_requested:
                return None  # a warm shutdown came meanwhile: take nothing more

    def _wait_for_a_run_to_end(self, since: int) -> None:
        self._wait_while(lambda: self._runs_ended == since)

    # -- heartbeats ------------------------------------------------------------------------

    def _start_heartbeats(self) -> None:
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(
                target=self._keep_in_flight_alive, name="heartbeats", daemon=True
            )
            with signals_left_to_the_main_thread():
                self._heartbeats.start()

    def _keep_in_flight_alive(self) -> None:
        """rq's per-job heartbeat (worker key, execution, job) for every job in flight."""
        while not self._heartbeats_stopped.wait(self.job_monitoring_interval):
            with self._job_ended:
                in_flight = list(self._in_flight.values())
            for flight in in_flight:
                try:
                    if self._stopped_for_overrun(flight):
                        continue
                    self.maintain_heartbeats(flight.job, flight.execution)
                except Exception as exc:
                    # Outages are ridden out inside; anything else must not end the thread.
                    log_event(
                        "heartbeat_failed", level="error", job_id=flight.job.id, error=repr(exc)
                    )

    # -- runs past their timeout -----------------------------------------------------------

    def _stopped_for_overrun(self, flight: InFlightJob) -> bool:
        """Cancel a run JOB_TIMEOUT_GRACE_S past rq's timeout; give it up as long again later.

        rq's timer exception reaches a thread only when it runs Python code: one blocked in
        native code (or catching it) runs on. A job process would be killed at this point.
        """
        overrun_s = flight.overrun_s()
        if overrun_s > 2 * self._timeout_grace_s:
            self._abandon(flight, overrun_s)
            return True
        if overrun_s > self._timeout_grace_s and RunStop.OVERRAN not in flight.stop:
            flight.stop |= RunStop.OVERRAN
            request_cancel(self.connection, flight.job.id)
            log_event(
                "task_overran_timeout",
                level="warning",
                task_id=flight.job.id,
                timeout_s=flight.job.timeout,
                overrun_s=round(overrun_s, 1),
                action="cancel",
            )
        return False

    def _abandon(self, flight: InFlightJob, overrun_s: float) -> None:
        """Hand a stuck run's job back, then stop taking work and exit for a restart."""
        # Before its slot frees up: take no new job. The main thread sees it within a second
        # (it looks at the queue in slices and waits for slots in slices while runs are out).
        self._stop_requested = True  # rq's private flag: its loop takes no more work
        handed_back = self._hand_back(
            flight,
            why=f"job thread still running {overrun_s:.0f} s past its timeout"
            f" ({flight.job.timeout} s): handed back, worker restarting",
        )
        if not handed_back:
            return
        self._stop.shutdown = self._stop.shutdown.at_least(Shutdown.RESTART)
        log_event(
            "job_thread_abandoned",
            level="error",
            task_id=flight.job.id,
            execution=flight.execution.id,
            overrun_s=round(overrun_s, 1),
        )

    # -- stopping --------------------------------------------------------------------------

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """rq override: ``Worker.work``, exiting 1 after a run was given up on."""
        worked: bool = super().work(*args, **kwargs)
        if self._stop.shutdown is Shutdown.RESTART:
            # A thread stuck in the process: only a new process is clean again.
            raise SystemExit(EXIT_RUN_ABANDONED)
        return worked

    def _hand_back_in_flight(self) -> None:
        with self._job_ended:
            in_flight = list(self._in_flight.values())
        for flight in in_flight:
            self._hand_back(flight, why="job thread stopped by a cold shutdown of the worker")

    def _hand_back(self, flight: InFlightJob, *, why: str) -> bool:
        """Revoke a run and put its task back (a retry from its checkpoint); False if it was
        settling its job meanwhile (then it ends on its own)."""
        execution = flight.execution
        if not flight.settling.acquire(timeout=_SETTLING_WAIT_S):
            return False
        try:
            revoke_in_process_run(execution.id)
        finally:
            flight.settling.release()
        self._end_flight(execution.id)
        self._hand_back_after_cold_shutdown(
            flight.job,
            flight.queue,
            execution,
            lease_pid=os.getpid(),
            run_id=execution.id,
            why=why,
        )
        return True

    def handle_payload(self, message: Any) -> None:
        """rq override: ``Worker.handle_payload``. rq's stop-job acts on "the" job of the
        worker (the first in flight here) and kills its job process, which in a concurrent
        worker is the worker itself: by job id here."""
        payload = parse_payload(message)
        if payload.get("command") == "stop-job":
            self._stop_job(str(payload.get("job_id", "")))
            return
        super().handle_payload(message)  # type: ignore[no-untyped-call]

    def _stop_job(self, job_id: str) -> None:
        with self._job_ended:
            executions = [e for e, f in self._in_flight.items() if f.job.id == job_id]
        if not executions:
            log_event("stop_job_ignored", level="warning", job_id=job_id, reason="not running")
        for execution_id in executions:
            self.request_stop_execution(execution_id)

    def request_stop_execution(self, execution_id: str) -> None:
        """rq override: ``Worker.request_stop_execution`` kills the job process; a job thread
        cannot be killed: its task is cancelled, stops at its next step, and its job ends
        STOPPED as rq's would."""
        flight = self._in_flight.get(execution_id)
        if flight is None:
            super().request_stop_execution(execution_id)
            return
        flight.stop |= RunStop.ASKED
        request_cancel(self.connection, flight.job.id)
        log_event("task_stop_requested", task_id=flight.job.id, execution=execution_id)

    def teardown(self) -> None:
        """rq override: ``Worker.teardown``, after the tasks in flight finished (warm) or
        were handed back (cold)."""
        cold = Shutdown.COLD
        try:
            self._act_on_stop_signal()
            if self._stop.shutdown is not cold and self._in_flight:
                log_event("waiting_for_tasks", worker=self.name, in_flight=len(self._in_flight))
                # Runs stuck past their timeout are handed back meanwhile (heartbeats).
                self._wait_while(lambda: bool(self._in_flight) and self._stop.shutdown is not cold)
        finally:
            if self._stop.shutdown is cold:
                self._hand_back_in_flight()
            self._heartbeats_stopped.set()
            super().teardown()


# Each worker class's threaded variant, built once.
_VARIANTS: dict[type[StopSignalsWorker], type[JobThreadsWorker]] = {}


def threaded_variant(worker_class: type[StopSignalsWorker]) -> type[JobThreadsWorker]:
    """``worker_class`` running its jobs in job threads: it keeps its name and everything
    it adds (an operator's subclass extending ``allowed_functions``, say), and
    ``JobThreadsWorker`` sits under it, so what the class overrides still runs first."""
    if worker_class not in _VARIANTS:
        variant = type(
            worker_class.__name__,
            (worker_class, JobThreadsWorker),
            {"__module__": worker_class.__module__, "__qualname__": worker_class.__qualname__},
        )
        _VARIANTS[worker_class] = cast(type[JobThreadsWorker], variant)
    return _VARIANTS[worker_class]
