"""Redis outages, as every part of the worker rides them out.

A Redis that is gone (restart, network) and a Redis that answers but refuses
writes are the same outage to us: a refused write had no effect, and the same
command works once Redis accepts writes again. The refusals are

- ``OOM`` (``OutOfMemoryError``): ``maxmemory`` reached under ``noeviction``;
- ``READONLY`` (``ReadOnlyError``): the server became a replica after a failover;
- ``LOADING`` (``BusyLoadingError``): a restarted server is still loading its data;
- ``MASTERDOWN`` (``MasterDownError``): a replica lost its primary;
- ``MISCONF`` (a ``ResponseError``): the server cannot persist and stopped writes;
- ``UNBLOCKED`` (a ``ResponseError``): a blocking command cut off by a role change.

Use ``REDIS_UNAVAILABLE`` in ``except`` clauses (with ``is_redis_outage`` for the
``MISCONF`` case), ``patient_redis_retry`` on every connection, and
``until_redis_answers`` around a call that must not give up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from worker.exceptions import ConfigurationError
from worker.logs import log_event

__all__ = [
    "OUTAGE_KINDS",
    "REDIS_UNAVAILABLE",
    "PatientRetry",
    "RedisOutage",
    "access_refusal",
    "check_redis_access",
    "is_redis_outage",
    "outage_kind",
    "patient_redis_retry",
    "redis_error_line",
    "until_redis_answers",
]

# Errors after which the same command succeeds once Redis is back or accepts writes.
REDIS_UNAVAILABLE: tuple[type[RedisError], ...] = (
    RedisConnectionError,  # BusyLoadingError is one
    RedisTimeoutError,
    OutOfMemoryError,
    ReadOnlyError,
    MasterDownError,
)
# redis-py has no class for these: MISCONF (persistence failing) and UNBLOCKED (a blocked
# command, rq's BLMOVE, cut off when the server turned replica) are plain ResponseErrors.
_REFUSAL_PREFIXES = ("MISCONF", "UNBLOCKED")

# How long a command waits out an outage by default (REDIS_PATIENCE_S): 19 retries of the
# backoff below (0.1 s doubling, capped at 2 s) add up to 33 s.
DEFAULT_REDIS_PATIENCE_S = 33.0
_BACKOFF_BASE_S = 0.1
_BACKOFF_CAP_S = 2.0

T = TypeVar("T")


class RedisOutage(RedisError):
    """Raised by ``until_redis_answers`` once ``give_up_after_s`` has passed."""


def is_redis_outage(error: BaseException) -> bool:
    """True for a lost connection and for a refusal that ends when Redis recovers."""
    if isinstance(error, REDIS_UNAVAILABLE):
        return True
    return isinstance(error, ResponseError) and str(error).startswith(_REFUSAL_PREFIXES)


def access_refusal(error: BaseException) -> str | None:
    """What the operator must fix when Redis answered but refused this client: a wrong or
    missing password, or a database index the server does not have. None otherwise (an
    outage, a bug): waiting does not cure a refusal, so callers stop with this line."""
    if isinstance(error, AuthenticationError):
        # Redis's own text ("HELLO must be called ...") does not say which one.
        return "Redis refuses the password in REDIS_URL (wrong, or none given)"
    if isinstance(error, ResponseError) and "DB index is out of range" in str(error):
        return (
            "Redis has no database with the number in REDIS_URL's path "
            "(DB index is out of range: the server's `databases` setting caps it)"
        )
    return None


def redis_error_line(error: RedisError) -> str:
    """The one line an operator's command prints when Redis failed it."""
    return access_refusal(error) or f"cannot reach Redis: {error}"


def check_redis_access(connection: Redis) -> RedisError | None:
    """PING once at start: raise ConfigurationError when Redis refuses this client.

    An outage is returned (None: Redis answered), for the caller to wait out or report.
    """
    try:
        connection.ping()
    except RedisError as exc:
        refusal = access_refusal(exc)
        if refusal is not None:
            raise ConfigurationError(refusal) from None
        return exc
    return None


# The kinds outage_kind names; a refused command's own first word (from ResponseError)
# comes on top. Metrics start each at 0, so the first outage is an increase.
OUTAGE_KINDS = ("connection", "timeout", "loading", "oom", "readonly", "masterdown")


def outage_kind(error: BaseException) -> str:
    """A short label for logs and metrics: ``connection``, ``oom``, ``readonly``, ..."""
    if isinstance(error, BusyLoadingError):
        return "loading"
    if isinstance(error, OutOfMemoryError):
        return "oom"
    if isinstance(error, ReadOnlyError):
        return "readonly"
    if isinstance(error, MasterDownError):
        return "masterdown"
    if isinstance(error, RedisTimeoutError):
        return "timeout"
    if isinstance(error, ResponseError):
        return str(error).split(" ", 1)[0].lower() or "refused"
    return "connection"


class PatientRetry(Retry):
    """redis-py's retry, shared by every connection built from it, that can stop waiting.

    redis-py deep-copies a retry into each new connection; this one hands out itself
    (its exponential backoff keeps no state), so ``stop_waiting`` reaches every
    connection of a client at once. It only writes one attribute: a signal handler may
    call it while a command is inside its own retry loop, which then fails at its next
    attempt.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> PatientRetry:
        return self

    def stop_waiting(self) -> None:
        """From now on a command fails at its first error (a worker stopping, Redis away)."""
        self._retries = 0


def patient_redis_retry(patience_s: float = DEFAULT_REDIS_PATIENCE_S) -> PatientRetry:
    """How long every process of a worker waits for Redis before a command fails.

    A restarting Redis (loading its append-only file, a failover) is gone for
    seconds, longer than redis-py's default retry (~3 s). A job process that met
    it mid-task would end its task with an error; waiting, it resumes where it was.
    Refused writes (OOM, READONLY, LOADING) are retried the same way.
    """
    backoff = ExponentialBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S)
    retries, waited_s = 0, 0.0
    while waited_s < patience_s:
        retries += 1
        waited_s += backoff.compute(retries)
    return PatientRetry(backoff, retries=retries, supported_errors=REDIS_UNAVAILABLE)


def until_redis_answers(
    during: str,
    action: Callable[[], T],
    *,
    first_wait_s: float = 1.0,
    max_wait_s: float = 30.0,
    give_up_after_s: float | None = None,
    on_outage: Callable[[str, BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``action``, waiting out a Redis outage (or refusal) with exponential backoff.

    Each wait logs ``redis_unavailable`` with ``during`` and the outage ``kind``.
    Without ``give_up_after_s`` it waits as long as it takes (the worker parent);
    with it, it raises ``RedisOutage`` from the last error after that long.
    """
    wait_s = first_wait_s
    started = time.monotonic()
    while True:
        try:
            return action()
        except RedisError as exc:
            if not is_redis_outage(exc):
                raise
            if on_outage is not None:
                on_outage(during, exc)
            if give_up_after_s is not None and time.monotonic() - started >= give_up_after_s:
                raise RedisOutage(f"Redis unavailable during {during}: {exc}") from exc
            log_event(
                "redis_unavailable",
                level="warning",
                during=during,
                kind=outage_kind(exc),
                error=str(exc),
                retry_in_s=wait_s,
            )
            sleep(wait_s)
            wait_s = min(wait_s * 2, max_wait_s)
