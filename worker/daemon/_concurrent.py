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
every task in flight back at once (a crash re-run, from its checkpoint), then exits. The
signal handlers only raise or set flags; the hand-back runs in teardown.

A thread cannot be killed: what rq does to a job process is done to a run instead
(``worker.daemon._job_threads``).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from rq.command import parse_payload
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import (
    BaseDeathPenalty,
    UnixSignalDeathPenalty,
)
from rq.utils import now
from rq.worker.base import SHUTDOWN_SIGNAL

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
    outcome_of,
    size_connection_pool,
)
from worker.daemon._one_job import VettingWorker
from worker.daemon._vetting import JobCheck
from worker.logs import log_event, writing_on_this_thread
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


class ConcurrentWorker(VettingWorker):
    """The vetting worker running up to ``concurrency`` jobs at once in job threads.

    With ``concurrency`` 1 (the default) nothing changes: rq forks a job process per job,
    nothing is ever in flight in a thread, and every method that reads the in-flight jobs
    (waiting, stop-execution, shutdown) finds none and does what rq does. The mode is asked
    only where a job thread differs: handing a job over, settling it, rq's stop-job, and
    its heartbeat TTL.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        super().__init__(*args, **kwargs)
        self.concurrency = 1  # WORKER_CONCURRENCY, read at start (bootstrap)
        # Jobs in job threads by execution id, guarded by the condition's lock; the main
        # thread waits on it for a free slot, teardown for the last job.
        self._in_flight: dict[str, InFlightJob] = {}
        self._job_ended = threading.Condition()
        self._runs_ended = 0  # ever: a burst worker's empty look counts only if none ended since
        self._waiting_for_job = False
        self._cold_shutdown = False
        self._stop_signal_pending = False
        self._heartbeats: threading.Thread | None = None
        self._heartbeats_stopped = threading.Event()
        # Executions rq's stop-job or stop-execution asked to stop, and runs past their
        # timeout whose task was cancelled; runs given up on (the worker then exits 1).
        self._stop_asked: set[str] = set()
        self._overrun_cancelled: set[str] = set()
        self._abandoned_runs = 0
        # rq keeps one "stopped job" for the worker; job threads settle theirs one at a time.
        self._settling_stopped_job = threading.Lock()

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
        return JobThreadDeathPenalty

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        ttl: int = super().get_heartbeat_ttl(job, working_time)
        if not self.concurrent:
            return ttl
        # rq's TTL shrinks to the time left before the timeout and goes negative past it
        # (a job process is killed by then); a run past its timeout stays alive until it
        # is handed back, so its execution must never look expired while it runs.
        return max(ttl, int(self.job_monitoring_interval) + 60)

    def configured_concurrency(self) -> int:
        """Tasks at once, read at start: WORKER_CONCURRENCY (AgentWorker asks its host)."""
        return settings_or_exit().worker_concurrency

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        self.concurrency = self.configured_concurrency()
        size_connection_pool(self.connection, self.concurrency)
        super().bootstrap(*args, **kwargs)

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
            if not run_is_revoked(execution.id):
                self._after_job(job, check, execution.id)
        except Exception as exc:
            # The thread must still free its slot; rq's maintenance settles the job.
            log_event("job_thread_failed", level="error", job_id=job.id, error=repr(exc))
        finally:
            self._stop_asked.discard(execution.id)
            self._overrun_cancelled.discard(execution.id)
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
        if not self.concurrent:
            super()._finalize_success(job, queue, execution, return_value)
            return
        with self._settling(execution) as owned:
            if not owned:
                return
            if execution.id in self._stop_asked and outcome_of(return_value) == Outcome.CANCELLED:
                self._settle_stopped(job, queue, execution)
                return
            super()._finalize_success(job, queue, execution, return_value)

    def _finalize_failure(
        self, job: Job, queue: Queue, execution: Execution, exc_info: Any
    ) -> None:
        if not self.concurrent:
            super()._finalize_failure(job, queue, execution, exc_info)
            return
        with self._settling(execution) as owned:
            if owned:
                super()._finalize_failure(job, queue, execution, exc_info)

    @contextmanager
    def _settling(self, execution: Execution) -> Iterator[bool]:
        """Settle a run's job only while it is still this run's: False once handed back."""
        flight = self._in_flight.get(execution.id)
        if flight is None or run_is_revoked(execution.id):
            log_event("handed_back_run_fenced", level="warning", execution=execution.id)
            yield False
            return
        with flight.settling:
            owned = not run_is_revoked(execution.id)
            if not owned:
                log_event("handed_back_run_fenced", level="warning", execution=execution.id)
            yield owned

    def _settle_stopped(self, job: Job, queue: Queue, execution: Execution) -> None:
        """What rq does with a job process stop-job killed: STOPPED, never retried."""
        job.ended_at = now()
        with self._settling_stopped_job:
            self._stopped_job_id = job.id  # rq's marker, read by handle_job_failure
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
            self._waiting_for_job = True
            try:
                result = super().dequeue_job_and_maintain_ttl(timeout, idle_left)
            finally:
                self._waiting_for_job = False
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
        execution_id = flight.execution.id
        if overrun_s > 2 * self._timeout_grace_s:
            self._abandon(flight, overrun_s)
            return True
        if overrun_s > self._timeout_grace_s and execution_id not in self._overrun_cancelled:
            self._overrun_cancelled.add(execution_id)
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
        self._stop_requested = True
        handed_back = self._hand_back(
            flight,
            why=f"job thread still running {overrun_s:.0f} s past its timeout"
            f" ({flight.job.timeout} s): handed back, worker restarting",
        )
        if not handed_back:
            return
        self._abandoned_runs += 1
        log_event(
            "job_thread_abandoned",
            level="error",
            task_id=flight.job.id,
            execution=flight.execution.id,
            overrun_s=round(overrun_s, 1),
        )

    # -- stopping --------------------------------------------------------------------------

    def work(self, *args: Any, **kwargs: Any) -> bool:
        worked: bool = super().work(*args, **kwargs)
        if self._abandoned_runs:
            # A thread stuck in the process: only a new process is clean again.
            raise SystemExit(EXIT_RUN_ABANDONED)
        return worked

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """The first SIGTERM/SIGINT (warm shutdown), run inside whatever the main thread was
        doing: a log write holding the log lock, say (stderr back-pressured).

        rq's handler logs there and raises StopRequested into it. Here, inside a log write,
        the handler only sets flags, and the main thread logs and raises at its next step
        (``_act_on_stop_signal``, ``heartbeat``); anywhere else it acts at once, as rq does.
        """
        self._shutdown_requested_date = now()
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        self._stop_requested = True
        self._stop_signal_pending = True
        if writing_on_this_thread():
            return
        self._act_on_stop_signal()
        if self._waiting_for_job:
            raise StopRequested()  # out of the blocking dequeue, as rq does

    def _act_on_stop_signal(self) -> None:
        """What rq's warm-shutdown handler does besides setting flags (logs, Redis)."""
        if not self._stop_signal_pending:
            return
        self._stop_signal_pending = False
        self.handle_warm_shutdown_request()  # type: ignore[no-untyped-call]
        self.set_shutdown_requested_date()  # type: ignore[no-untyped-call]

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        super().heartbeat(timeout, pipeline)  # type: ignore[no-untyped-call]
        if pipeline is not None or threading.current_thread() is not threading.main_thread():
            return
        # rq's loop calls this at every turn, also while it waits on the queue: a stop
        # signal that could not raise in its handler (it came during a log write) acts here.
        self._act_on_stop_signal()
        if self._stop_requested and self._waiting_for_job:
            raise StopRequested()

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler: it only marks the cold shutdown (rq raises SystemExit); the
        # tasks are handed back by teardown, outside the handler, where no lock is held.
        try:
            super().request_force_stop(signum, frame)
        except SystemExit:
            self._cold_shutdown = True
            raise

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
        # rq's stop-job acts on "the" job of the worker (the first in flight here) and kills
        # its job process, which in a concurrent worker is the worker itself: by job id here.
        if self.concurrent:
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
        # rq's stop-job kills the job process; a job thread cannot be killed: its task is
        # cancelled, stops at its next step, and its job ends STOPPED as rq's would.
        flight = self._in_flight.get(execution_id)
        if flight is None:
            super().request_stop_execution(execution_id)
            return
        self._stop_asked.add(execution_id)
        request_cancel(self.connection, flight.job.id)
        log_event("task_stop_requested", task_id=flight.job.id, execution=execution_id)

    def kill_horse(self, sig: signal.Signals = SHUTDOWN_SIGNAL) -> None:
        # rq kills the job process's group; with no job process (pid 0) that group would be
        # the worker's own: every task in flight and everything started beside it.
        if not self.horse_pid:
            log_event("kill_horse_ignored", level="warning", reason="no job process")
            return
        super().kill_horse(sig)  # type: ignore[no-untyped-call]

    def teardown(self) -> None:
        try:
            self._act_on_stop_signal()
            if not self._cold_shutdown and self._in_flight:
                log_event("waiting_for_tasks", worker=self.name, in_flight=len(self._in_flight))
                # Runs stuck past their timeout are handed back meanwhile (heartbeats).
                self._wait_while(lambda: bool(self._in_flight) and not self._cold_shutdown)
        finally:
            if self._cold_shutdown:
                self._hand_back_in_flight()
            self._heartbeats_stopped.set()
            super().teardown()  # type: ignore[no-untyped-call]
