"""rq settings module: ``RQ_CONFIG=worker.rq_config rq worker agents``.

rq reads the UPPERCASE names of this module to build the worker's Redis
connection (``REDIS_URL``, or ``SENTINEL`` when ``REDIS_SENTINELS`` is set), so
``rq worker``, ``rq info`` and every ``agent-worker`` command reach the same Redis
through ``worker.redis_io._connection``. ``RQ_REDIS_URL`` or ``--url`` would override it:
leave them unset. A bad setting, or a Redis that refuses the credentials or the database
of ``REDIS_URL``, stops rq here with one line (rq would print a traceback). A Redis that
does not answer is waited for as long as the worker waits out an outage
(``REDIS_PATIENCE_S``); still unreachable, it stops rq with one JSON log line naming the
variable (rq's own CLI would log a bare ``Error 111 connecting to ...``).
"""

from __future__ import annotations

import sys
from typing import Any

from redis import Redis

from worker._network import shown_url
from worker.exceptions import ConfigurationError
from worker.logs import log_event
from worker.redis_io import (
    check_redis_access,
    connect,
    patient_redis_retry,
    rq_connection_settings,
)
from worker.settings import Settings, settings_or_exit


def _connection_settings() -> dict[str, Any]:
    try:
        settings = settings_or_exit()
        connection = connect(settings)
        try:
            _wait_for_redis(connection, settings)
        finally:
            connection.close()
        return rq_connection_settings(settings)
    except ConfigurationError as exc:
        print(f"agent-worker: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


def _wait_for_redis(connection: Redis, settings: Settings) -> None:
    """PING, waiting out an outage; a refusal is a ConfigurationError, a Redis still
    unreachable after REDIS_PATIENCE_S one ``redis_unavailable`` line and exit status 1."""
    connection.set_retry(patient_redis_retry(settings.redis_patience_s))
    outage = check_redis_access(connection)
    if outage is None:
        return
    if settings.redis_sentinels:
        variable, where = "REDIS_SENTINELS", settings.redis_sentinels
    else:
        variable, where = "REDIS_URL", shown_url(settings.redis_url)
    log_event(
        "redis_unavailable",
        "error",
        variable=variable,
        redis=where,
        waited_s=settings.redis_patience_s,
        error=type(outage).__name__,
        detail=str(outage),
    )
    raise SystemExit(1)


_CONNECTION = _connection_settings()

REDIS_URL: str | None = _CONNECTION["REDIS_URL"]
SENTINEL: dict[str, Any] | None = _CONNECTION["SENTINEL"]
