"""JSON-line logs on stderr: ``{"ts", "level", "event", ...}``, one object per line.

Every string value passes through the process redactor, so a secret that slips
into a field or an exception message is masked before it is written.

Safe in a signal handler: a line logged while its own thread is inside a write (the
handler interrupted it, say on a back-pressured stderr) is queued and written by the
next line, instead of waiting for a lock that thread holds. A line written
inside an OpenTelemetry span carries its ``trace_id`` and ``span_id``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TextIO

from opentelemetry import trace

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_lock = threading.Lock()
# Which threads are inside a write, and the lines logged meanwhile by a signal handler
# running on one of them (deque appends need no lock).
_writing = threading.local()
_deferred: deque[str] = deque()
_redact: Callable[[str], str] = str
# Field values repeat from line to line (agent, task, model, tool, status): short ones
# are redacted once and remembered, which halves the cost of a line.
_SHORT_VALUE_CHARS = 80
_redact_short: Callable[[str], str] = lru_cache(maxsize=4096)(str)
_min_level = _LEVELS["info"]
_stream: TextIO | None = None


def _new_lock_after_fork() -> None:
    # A thread of the parent may hold the lock at the moment rq forks a job process (or its
    # scheduler); lines queued by a signal handler are the parent's to write.
    global _lock
    _lock = threading.Lock()
    _deferred.clear()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def set_redactor(redact: Callable[[str], str]) -> None:
    global _redact, _redact_short
    _redact = redact
    _redact_short = lru_cache(maxsize=4096)(redact)


def redact(text: str) -> str:
    """``text`` through the process redactor logs use (identity until one is set)."""
    return _redact(text)


def set_level(level: str) -> None:
    global _min_level
    _min_level = _LEVELS.get(level.lower(), _LEVELS["info"])


@contextmanager
def only_at_least(level: str) -> Iterator[None]:
    """Meanwhile write only lines at ``level`` or above: for a command whose own output
    says what the lower lines would (``agent-worker check`` prints each warning once)."""
    global _min_level
    before = _min_level
    _min_level = max(before, _LEVELS[level])
    try:
        yield
    finally:
        _min_level = before


def set_stream(stream: TextIO | None) -> None:
    """Send logs somewhere else than stderr (tests); None restores stderr."""
    global _stream
    _stream = stream


# One encoder for every line: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(ensure_ascii=False, default=str).encode


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return _redact_short(value) if len(value) <= _SHORT_VALUE_CHARS else _redact(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _redact(str(value))


def enabled(level: str = "info") -> bool:
    """Would a line at ``level`` be written? Lets a caller skip building one that would not."""
    return _LEVELS.get(level, 20) >= _min_level


def log_event(event: str, level: str = "info", **fields: Any) -> None:
    if _LEVELS.get(level, 20) < _min_level:
        return
    record = {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "level": level,
        "event": event,
    }
    record.update(_clean(fields))
    # A line written inside a span names it, so logs and traces join on trace_id.
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        record["trace_id"] = format(span_context.trace_id, "032x")
        record["span_id"] = format(span_context.span_id, "016x")
    _write(_encode(record) + "\n")


def writing_on_this_thread() -> bool:
    """True while the calling thread is inside a write (a signal handler asking about the
    code it interrupted): raising there would cut a line in two."""
    return bool(getattr(_writing, "active", False))


def _write(line: str) -> None:
    if getattr(_writing, "active", False):
        _deferred.append(line)  # a signal handler interrupted this thread's own write
        return
    _writing.active = True
    try:
        stream = _stream or sys.stderr
        with _lock:
            while _deferred:
                stream.write(_deferred.popleft())
            stream.write(line)
            stream.flush()
    finally:
        _writing.active = False
