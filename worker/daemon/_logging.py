"""rq's own log records as JSON lines, so stderr carries one format (docs: Observability)."""

from __future__ import annotations

import logging
import re

from rq.logutils import ColorizingStreamHandler

from worker.logs import log_event

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_TRACEBACK = "Traceback (most recent call last):"
# How run_task fails a job once its report is written: the frames above it are rq's and ours,
# the same for every failed task, so only the last line says anything.
_TASK_FAILED = "worker.exceptions.TaskFailed: "
_LEVELS = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


class _RqRecordsAsEvents(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {
                "logger": record.name,
                "message": _one_line_task_failure(_ANSI_ESCAPE.sub("", record.getMessage())),
            }
            if record.exc_info:
                fields["exception"] = logging.Formatter().formatException(record.exc_info)
        except Exception:
            self.handleError(record)
            return
        # Outside the try: what a signal handler raises during the write (rq's StopRequested)
        # must reach rq's loop, not be reported as a logging error and lost.
        log_event("rq_log", level=_LEVELS.get(record.levelno, "info"), **fields)


def _one_line_task_failure(message: str) -> str:
    """rq's "exception raised while executing" message, without the traceback of a TaskFailed.

    Any other exception keeps its traceback: that one is a bug worth its frames.
    """
    head, marker, traceback = message.partition(_TRACEBACK)
    last = traceback.strip().splitlines()[-1] if traceback.strip() else ""
    if not marker or not last.startswith(_TASK_FAILED):
        return message
    return f"{head.rstrip()} {last.removeprefix('worker.exceptions.')}"


def send_rq_logs_to_events() -> None:
    """Route every ``rq.*`` logger through ``log_event`` instead of rq's coloured text.

    rq's CLI has already given ``rq.worker`` its own stdout handler; only those
    rq handlers are removed, so a logging config of the operator's stays.
    """
    rq_logger = logging.getLogger("rq")
    if not any(isinstance(handler, _RqRecordsAsEvents) for handler in rq_logger.handlers):
        rq_logger.addHandler(_RqRecordsAsEvents())
    rq_logger.propagate = False
    # rq's CLI reports a lost connection with logging.error() on the root logger, which
    # would print "ERROR:root:..." in the middle of the JSON lines; unless the operator
    # configured the root logger, it goes the same way.
    if not logging.root.handlers:
        logging.root.addHandler(_RqRecordsAsEvents())
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("rq.") and isinstance(logger, logging.Logger):
            rq_handlers = [h for h in logger.handlers if isinstance(h, ColorizingStreamHandler)]
            for handler in rq_handlers:
                logger.removeHandler(handler)
            if rq_handlers:
                logger.propagate = True
