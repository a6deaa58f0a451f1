"""rq settings module: ``RQ_CONFIG=worker.rq_config rq worker agents``.

rq reads the UPPERCASE names of this module to build the worker's Redis
connection (``REDIS_URL``, or ``SENTINEL`` when ``REDIS_SENTINELS`` is set), so
``rq worker``, ``rq info`` and every ``agent-worker`` command reach the same Redis
through ``worker.redis_io._connection``. ``RQ_REDIS_URL`` or ``--url`` would override it:
leave them unset. A bad setting, or a Redis that refuses the credentials or the database
of ``REDIS_URL``, stops rq here with one line (rq would print a traceback).
"""

from __future__ import annotations

import sys
from typing import Any

from worker.exceptions import ConfigurationError
from worker.redis_io import check_redis_access, connect, rq_connection_settings
from worker.settings import settings_or_exit


def _connection_settings() -> dict[str, Any]:
    try:
        settings = settings_or_exit()
        connection = connect(settings)
        try:
            check_redis_access(connection)
        finally:
            connection.close()
        return rq_connection_settings(settings)
    except ConfigurationError as exc:
        print(f"agent-worker: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


_CONNECTION = _connection_settings()

REDIS_URL: str | None = _CONNECTION["REDIS_URL"]
SENTINEL: dict[str, Any] | None = _CONNECTION["SENTINEL"]
