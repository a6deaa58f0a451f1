"""How a worker stops on a signal, in either mode (a job process per job, or job threads).

    first SIGTERM/SIGINT   warm: take no more work; what is running finishes
    second one             cold: rq raises SystemExit; teardown hands back what is in flight

rq's handlers log and write to Redis inside the handler, and raise ``StopRequested`` into
whatever the main thread was doing. A handler runs inside a log write too (stderr
back-pressured, the log lock held): there it only records the stop (``StopState``), and the
main thread logs and raises at its next step (``heartbeat``, teardown, a wait for a slot).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from enum import Enum
from types import FrameType
from typing import Any

from rq.exceptions import StopRequested
from rq.job import Job
from rq.queue import Queue
from rq.utils import now
from rq.worker.base import SHUTDOWN_SIGNAL

from worker.daemon._one_job import VettingWorker
from worker.logs import log_event, writing_on_this_thread


class Shutdown(Enum):
    """How far a worker's stop has gone, each level including the ones before it."""

    NONE = "none"
    WARM = "warm"  # a first signal: take no more work, let what runs finish
    RESTART = "restart"  # a run was given up on: take no more work, then exit 1
    COLD = "cold"  # a second signal: hand every task in flight back now

    def at_least(self, level: Shutdown) -> Shutdown:
        """The further of this level and ``level``."""
        order = list(Shutdown)
        return max(self, level, key=order.index)


@dataclass
class StopState:
    """Where the worker's stop is: written by signal handlers, acted on by the main thread."""

    shutdown: Shutdown = Shutdown.NONE
    # A warm stop whose log line and Redis write the main thread still owes (the signal
    # came inside a log write).
    unreported: bool = False
    # The main thread is blocked on the queue: a stop raises out of that wait, as rq's does.
    waiting_for_job: bool = False


class StopSignalsWorker(VettingWorker):
    """The vetting worker whose signal handlers are safe inside a log write."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No side effects here: `rq info` and Worker.all() instantiate this class (trap 1).
        super().__init__(*args, **kwargs)
        self._stop = StopState()

    def has_runs_in_flight(self) -> bool:
        """Whether a job runs in a thread of this process (never, with a job process)."""
        return False

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """rq override: ``Worker.dequeue_job_and_maintain_ttl``, noting the main thread
        waits on the queue (a stop raises out of that wait)."""
        self._stop.waiting_for_job = True
        try:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        finally:
            self._stop.waiting_for_job = False

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """The first SIGTERM/SIGINT (warm shutdown), run inside whatever the main thread was
        doing: a log write holding the log lock, say (stderr back-pressured).

        rq override: ``Worker.request_stop`` logs and raises StopRequested inside the
        handler. Here, inside a log write, the handler only records the stop, and the main
        thread logs and raises at its next step; anywhere else it acts at once, as rq does.
        """
        self._shutdown_requested_date = now()  # rq's private field, as its handler sets it
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        self._stop_requested = True  # rq's private flag: its loop takes no more work
        self._stop.shutdown = self._stop.shutdown.at_least(Shutdown.WARM)
        self._stop.unreported = True
        if writing_on_this_thread():
            return
        self._act_on_stop_signal()
        if self._stop.waiting_for_job:
            raise StopRequested()  # out of the blocking dequeue, as rq does

    def _act_on_stop_signal(self) -> None:
        """What rq's warm-shutdown handler does besides setting flags (logs, Redis)."""
        if not self._stop.unreported:
            return
        self._stop.unreported = False
        self.handle_warm_shutdown_request()  # type: ignore[no-untyped-call]
        self.set_shutdown_requested_date()  # type: ignore[no-untyped-call]

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """rq override: ``Worker.heartbeat``, rq's loop calls it at every turn, also while
        it waits on the queue: a stop signal that could not act in its handler acts here."""
        super().heartbeat(timeout, pipeline)
        if pipeline is not None or threading.current_thread() is not threading.main_thread():
            return
        self._act_on_stop_signal()
        if self._stop_requested and self._stop.waiting_for_job:
            raise StopRequested()

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """rq override: ``Worker.request_force_stop``, a signal handler: it only marks the
        cold shutdown (rq raises SystemExit); tasks in flight are handed back by teardown,
        outside the handler, where no lock is held."""
        try:
            super().request_force_stop(signum, frame)
        except SystemExit:
            self._stop.shutdown = Shutdown.COLD
            raise

    def kill_horse(self, sig: signal.Signals = SHUTDOWN_SIGNAL) -> None:
        """rq override: ``Worker.kill_horse`` kills the job process's group; with no job
        process (pid 0) that group would be the worker's own: every task in flight and
        everything started beside it."""
        if not self.horse_pid:
            log_event("kill_horse_ignored", level="warning", reason="no job process")
            return
        super().kill_horse(sig)  # type: ignore[no-untyped-call]

    def teardown(self) -> None:
        """rq override: ``Worker.teardown``, first owning up to a stop signal not acted on."""
        self._act_on_stop_signal()
        super().teardown()  # type: ignore[no-untyped-call]
