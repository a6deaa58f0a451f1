"""``agent-worker pool``: one process per host that forks, feeds and supervises its workers.

start       settings, logs, the job modules imported, the checks of
            ``agent-worker check``, the configuration parsed (as a worker
            does at start, once for all), everything frozen for the collector
            (``gc.freeze``: forks then share those pages), /metrics and /healthz
fork        N concurrent workers (``worker.daemon.pool._member``), each with a pipe
            its metrics come back through
supervise   a worker that dies is reaped at once: its jobs go back to the queue
            (``worker.daemon.pool._hand_back``) and a new worker takes its place
            (after a growing delay when it died young: 1 s, 2 s, ... 30 s)
stop        the first SIGTERM/SIGINT goes to every worker (rq's warm shutdown:
            tasks in flight finish), a second one too (cold: they are handed
            back); the pool exits once its last worker has
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis
from redis.exceptions import RedisError

from worker.daemon import AgentWorker
from worker.daemon._host import OWN_HOST, preload_configuration, write_metrics_textfile
from worker.daemon._logging import send_rq_logs_to_events
from worker.daemon._worker import health_check_client
from worker.daemon.pool._hand_back import hand_back_jobs_of
from worker.daemon.pool._member import MemberSpec, run_member
from worker.logs import log_event, set_level, set_redactor
from worker.metrics import (
    POOL_COUNTERS,
    POOL_GAUGES,
    apply_forwarded,
    stop_metrics_server,
    worker_metrics,
)
from worker.redaction import process_redactor
from worker.redis_io import connect
from worker.settings import Settings

# How often the supervisor looks for workers that ended.
_REAP_EVERY_S = 0.1
# A worker that ends sooner than this after its start is restarted after a delay that
# doubles each time, up to the cap: a worker that cannot start must not fork in a loop.
_YOUNG_S = 10.0
_FIRST_DELAY_S = 1.0
_MAX_DELAY_S = 30.0
# The exit status of a worker whose configuration is wrong (settings_or_exit): the pool
# stops, since every worker it forks would end the same way.
_BAD_CONFIGURATION = 2


@dataclass
class _Slot:
    """One of the pool's N places for a worker, and the worker that holds it now."""

    index: int
    pid: int = 0
    name: str = ""
    started: float = 0.0
    restart_at: float = 0.0
    delay_s: float = 0.0
    metrics_reader: threading.Thread | None = field(default=None, repr=False)


class Pool:
    """N concurrent workers of ``worker_class`` forked from this preloaded process."""

    def __init__(
        self,
        worker_class: type[AgentWorker],
        queue_names: Sequence[str],
        *,
        processes: int,
        concurrency: int,
        burst: bool = False,
    ) -> None:
        self.worker_class = worker_class
        self.queue_names = list(queue_names)
        self.processes = processes
        self.concurrency = concurrency
        self.burst = burst
        self._slots = [_Slot(index) for index in range(processes)]
        self._signals = 0
        self._restarts = 0
        self._status = 0

    # -- the run -----------------------------------------------------------------------

    def run(self, settings: Settings) -> int:
        """Start, fork, supervise until stopped (or, in burst mode, until every worker ended)."""
        connection = connect(settings)
        metrics_port = self._start(settings, connection)
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        for slot in self._slots:
            self._fork(slot, settings)
        log_event(
            "pool_started",
            pid=os.getpid(),
            processes=self.processes,
            concurrency=self.concurrency,
            queues=self.queue_names,
            metrics_port=metrics_port,
        )
        try:
            while any(slot.pid or slot.restart_at for slot in self._slots):
                self._reap(connection)
                self._restart_due(settings)
                time.sleep(_REAP_EVERY_S)
        finally:
            write_metrics_textfile(settings)
            stop_metrics_server()
            log_event("pool_stopped", pid=os.getpid(), restarts=self._restarts)
        return self._status

    def _start(self, settings: Settings, connection: Redis) -> int | None:
        """What every worker would do at start, done once here before the forks share it."""
        set_level(settings.log_level)
        set_redactor(process_redactor(settings.secret_values()))
        send_rq_logs_to_events()
        self.worker_class.import_job_modules()
        OWN_HOST.prepare(settings, connection, preload_configuration)
        worker_metrics().registry.register(_PoolCollector(self))
        port = OWN_HOST.serve_metrics(
            settings, lambda: health_check_client(connection), self.queue_names
        )
        gc.freeze()  # what is here now stays put: the forks share its pages
        return port

    # -- workers -----------------------------------------------------------------------

    def _fork(self, slot: _Slot, settings: Settings) -> None:
        read_fd, write_fd = os.pipe()
        name = f"{uuid.uuid4().hex}"
        spec = MemberSpec(
            worker_class=self.worker_class,
            queue_names=self.queue_names,
            name=name,
            concurrency=self.concurrency,
            burst=self.burst,
            metrics_fd=write_fd,
            pool_pid=os.getpid(),
        )
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            run_member(spec)
        os.close(write_fd)
        slot.pid, slot.name, slot.started, slot.restart_at = pid, name, time.monotonic(), 0.0
        if self._signals:  # a stop signal came while this one was being forked
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        slot.metrics_reader = threading.Thread(
            target=_apply_metrics_from, args=(read_fd,), name=f"metrics of {pid}", daemon=True
        )
        slot.metrics_reader.start()
        log_event("pool_worker_started", slot=slot.index, pid=pid, worker=name)

    def _reap(self, connection: Redis) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((slot for slot in self._slots if slot.pid == pid), None)
            if slot is not None:
                self._worker_ended(slot, wait_status, connection)

    def _worker_ended(self, slot: _Slot, wait_status: int, connection: Redis) -> None:
        pid, name, lived_s = slot.pid, slot.name, time.monotonic() - slot.started
        slot.pid = 0
        code = os.waitstatus_to_exitcode(wait_status)
        clean = code == 0
        log_event(
            "pool_worker_ended",
            level="info" if clean else "error",
            slot=slot.index,
            pid=pid,
            worker=name,
            exit_status=code,  # negative: the signal that ended it
            lived_s=round(lived_s, 1),
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # what it left in its group (rq's scheduler)
        if not clean:
            self._hand_back(connection, name, pid)
        if code == _BAD_CONFIGURATION:
            self._status = _BAD_CONFIGURATION
            self._stop_all(signal.SIGTERM)
        if self._signals or (self.burst and clean) or self._status:
            return
        young = lived_s < _YOUNG_S
        slot.delay_s = min(max(slot.delay_s * 2, _FIRST_DELAY_S), _MAX_DELAY_S) if young else 0.0
        slot.restart_at = time.monotonic() + slot.delay_s

    def _hand_back(self, connection: Redis, name: str, pid: int) -> None:
        try:
            hand_back_jobs_of(self.worker_class, connection, name, pid)
        except RedisError as exc:
            # rq's maintenance recovers them once their heartbeats expire.
            log_event("pool_hand_back_failed", level="error", worker=name, error=str(exc))

    def _restart_due(self, settings: Settings) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.restart_at and slot.restart_at <= now and not self._signals:
                self._restarts += 1
                self._fork(slot, settings)
            elif slot.restart_at and self._signals:
                slot.restart_at = 0.0

    # -- signals -----------------------------------------------------------------------

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        """A signal handler: only counts and forwards (no log line, no lock)."""
        self._signals += 1
        self._stop_all(signal.Signals(signum))

    def _stop_all(self, signum: signal.Signals) -> None:
        for slot in self._slots:
            if slot.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signum)

    def running(self) -> int:
        return sum(1 for slot in self._slots if slot.pid)

    def restarts(self) -> int:
        return self._restarts


def _apply_metrics_from(read_fd: int) -> None:
    """In a thread: apply every batch one worker forwards, until its pipe closes."""
    with os.fdopen(read_fd, "rb") as pipe:
        for line in pipe:
            apply_forwarded(line)


class _PoolCollector(Collector):
    """``agent_pool_workers{state}`` (running, configured) and the restarts counter."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        help_text, labels = POOL_GAUGES["agent_pool_workers"]
        workers = GaugeMetricFamily("agent_pool_workers", help_text, labels=list(labels))
        workers.add_metric(["running"], self._pool.running())
        workers.add_metric(["configured"], self._pool.processes)
        yield workers
        help_text, _ = POOL_COUNTERS["agent_pool_worker_restarts_total"]
        yield CounterMetricFamily(
            "agent_pool_worker_restarts", help_text, value=self._pool.restarts()
        )
