"""One worker of ``agent-worker pool``, in the process the pool forked for it.

    own session       a terminal's Ctrl-C reaches the pool only: the pool forwards it
    dies with the pool  the kernel sends it SIGTERM (a warm shutdown) if the pool dies
    own Redis connection  nothing the pool's sockets carry is shared
    MemberHost        no checks, no preloading (the pool did both before forking, and
                      this process shares those pages), no /metrics of its own: its
                      metrics go to the pool down a pipe, one JSON batch per line
    rq's work()       as ``rq worker agents`` runs it, with the pool's concurrency

It never returns: the process ends with ``os._exit`` and the worker's exit status, so
nothing of the pool's (atexit hooks, its servers) runs twice.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from redis import Redis

from worker.daemon import AgentWorker
from worker.daemon._host import OwnHost
from worker.logs import log_event
from worker.metrics import forward_metrics
from worker.redis_io import connect
from worker.settings import Settings, settings_or_exit

# prctl(2) option: the signal this process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class MemberSpec:
    """What the pool tells a worker it forks."""

    worker_class: type[AgentWorker]
    queue_names: Sequence[str]
    name: str
    concurrency: int
    burst: bool
    # The write end of this worker's metrics pipe to the pool.
    metrics_fd: int
    pool_pid: int


class MemberHost(OwnHost):
    """The host duties of a pool's worker: the pool has done them, or does them for it."""

    def __init__(self, concurrency: int, metrics_fd: int) -> None:
        self.concurrency = concurrency
        self._metrics_fd = metrics_fd
        self._send_lock = threading.Lock()
        self._pool_gone = False

    def prepare(
        self, settings: Settings, connection: Redis, preload: Callable[[frozenset[str]], None]
    ) -> None:
        return None  # checked and preloaded by the pool, before it forked this process

    def tasks_at_once(self, settings: Settings) -> int:
        return self.concurrency

    def serve_metrics(
        self, settings: Settings, health_client: Callable[[], Redis], queue_names: Sequence[str]
    ) -> int | None:
        return None  # the pool serves the host's; run_member sent this worker's metrics there

    def stop_serving(self, settings: Settings) -> None:
        return None  # the pool writes METRICS_TEXTFILE for the host

    def send(self, line: bytes) -> None:
        """Write one metrics batch line to the pool (``ForwardedMetrics``)."""
        # Job threads send at once: one line at a time, written whole.
        with self._send_lock:
            if self._pool_gone:
                return
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._metrics_fd, view) :]
            except BrokenPipeError:
                self._pool_gone = True  # the pool died: this worker stops (SIGTERM) soon
                log_event("pool_metrics_pipe_closed", level="warning")


def run_member(spec: MemberSpec) -> NoReturn:
    """Become the pool's worker ``spec.name`` in this freshly forked process."""
    status = 1
    try:
        os.setsid()
        _die_with_pool()
        if os.getppid() != spec.pool_pid:
            raise SystemExit(0)  # the pool died before this process asked to die with it
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)  # rq installs its own in work()
        host = MemberHost(spec.concurrency, spec.metrics_fd)
        forward_metrics(host.send)  # from the first count on, not only once rq has started
        connection = connect(settings_or_exit())
        worker = spec.worker_class(
            list(spec.queue_names), name=spec.name, connection=connection, host=host
        )
        worker.work(burst=spec.burst)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        log_event("pool_worker_failed", level="error", worker=spec.name, error=repr(exc))
    finally:
        sys.stderr.flush()
        os._exit(status)


def _die_with_pool() -> None:
    """Ask Linux for a SIGTERM when the pool dies: the worker then stops warm on its own."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
