"""log_event called again on a thread that is inside a write (a signal handler interrupting
it) queues its line instead of waiting for the lock that thread holds."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pytest

from worker.logs import log_event, set_stream, writing_on_this_thread


class InterruptedStream(io.StringIO):
    """A stream whose first write is interrupted by a 'signal handler' that logs."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False
        self.seen_writing: list[bool] = []

    def write(self, text: str) -> int:
        if not self.interrupted:
            self.interrupted = True
            self.seen_writing.append(writing_on_this_thread())
            log_event("from_the_handler")  # would block forever on a plain lock
        return super().write(text)


@pytest.fixture
def stream() -> Iterator[InterruptedStream]:
    interrupted = InterruptedStream()
    set_stream(interrupted)
    yield interrupted
    set_stream(None)


def events(stream: io.StringIO) -> list[str]:
    return [json.loads(line)["event"] for line in stream.getvalue().splitlines()]


def test_a_line_logged_inside_a_write_is_queued_and_written_by_the_next_line(
    stream: InterruptedStream,
) -> None:
    finished = threading.Event()

    def log_twice() -> None:
        log_event("first")
        log_event("second")
        finished.set()

    threading.Thread(target=log_twice, daemon=True).start()

    assert finished.wait(10), "log_event deadlocked on its own thread's lock"
    assert stream.seen_writing == [True]
    assert events(stream) == ["first", "from_the_handler", "second"]
    assert not writing_on_this_thread()
