"""rq's own log records as JSON lines, so stderr carries one format (DESIGN.md section 10)."""

from __future__ import annotations

import logging
import re

from rq.logutils import ColorizingStreamHandler

from worker.logs import log_event

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
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
                "message": _ANSI_ESCAPE.sub("", record.getMessage()),
            }
            if record.exc_info:
                fields["exception"] = logging.Formatter().formatException(record.exc_info)
            log_event("rq_log", level=_LEVELS.get(record.levelno, "info"), **fields)
        except Exception:
            self.handleError(record)


def send_rq_logs_to_events() -> None:
    """Route every ``rq.*`` logger through ``log_event`` instead of rq's coloured text.

    rq's CLI has already given ``rq.worker`` its own stdout handler; only those
    rq handlers are removed, so a logging config of the operator's stays.
    """
    rq_logger = logging.getLogger("rq")
    if not any(isinstance(handler, _RqRecordsAsEvents) for handler in rq_logger.handlers):
        rq_logger.addHandler(_RqRecordsAsEvents())
    rq_logger.propagate = False
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("rq.") and isinstance(logger, logging.Logger):
            rq_handlers = [h for h in logger.handlers if isinstance(h, ColorizingStreamHandler)]
            for handler in rq_handlers:
                logger.removeHandler(handler)
            if rq_handlers:
                logger.propagate = True
