"""Signals for the main thread: threads of the worker's own that never start a process.

Python runs every signal handler in the main thread, but the kernel hands a signal sent
to the process to any thread that does not block it, often one that is running at that
moment. A main thread blocked in a system call (rq waiting on the queue, or on its job
process) is then not interrupted, and rq's warm shutdown, cold shutdown or job-monitoring
alarm waits until that call returns by itself: up to a minute.

A thread started inside ``signals_left_to_the_main_thread`` blocks those signals for
good (a thread inherits its creator's mask), so the kernel never picks it. Only for
threads that never start a process: a child inherits the mask too, and would ignore the
SIGTERM that stops it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

# rq's warm and cold shutdown, and the alarm that wakes its job monitoring.
MAIN_THREAD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGALRM})


@contextmanager
def signals_left_to_the_main_thread() -> Iterator[None]:
    """Threads started inside block ``MAIN_THREAD_SIGNALS``; the caller's mask is restored
    after (a signal that comes meanwhile waits the moment and is then handled as ever)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
