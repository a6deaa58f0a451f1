"""The start of every command that works on this host's Redis: its settings, the Redis of
``REDIS_URL`` (or ``--redis-url``), and a redactor for every error line it prints."""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from worker.operations._redis_option import use_redis_url
from worker.redaction import Redactor, process_redactor
from worker.redis_io import CappedJob, connect
from worker.settings import Settings, settings_or_exit


@dataclass(frozen=True, kw_only=True)
class OperatorSession:
    settings: Settings
    redis: Redis
    redact: Redactor


def open_session(redis_url: str | None) -> OperatorSession:
    """Settings (or exit 2 naming the bad variable), then Redis; the caller closes ``redis``."""
    use_redis_url(redis_url)
    settings = settings_or_exit()
    # Task jobs are read with the cap the workers apply, so a command refuses what they would.
    CappedJob.max_data_bytes = settings.job_data_max_bytes
    return OperatorSession(
        settings=settings,
        redis=connect(settings),
        redact=process_redactor(settings.secret_values()),
    )
