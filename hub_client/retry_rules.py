"""How a failed call is answered, decided once for every HTTP client of the project.

    classify_status(status)   what an HTTP status (or no answer at all) means:
                              TRANSIENT (try again), AUTH (fix the key) or REFUSED
    retry_after_s(headers)    the server's pause hint, in seconds, or None
    Backoff(...).delay_s(n)   how long to wait before the n-th retry (0-based)

The Hub client, the native model providers and the CLI executors all read a status
through ``classify_status``, so one provider answer ends a task the same way whichever
executor ran it; docs/http-status.md tables each status. The module lives in
``hub_client`` because the Hub client imports nothing of the worker, while the worker
may import it; it uses nothing but the standard library.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum

__all__ = ["Backoff", "Failure", "Jitter", "classify_status", "retry_after_s"]

# 501 Not Implemented and 505 HTTP Version Not Supported describe the request, not the
# server's health: sending it again cannot work.
_PERMANENT_SERVER_STATUSES = frozenset({501, 505})
# 409: a request with the same Idempotency-Key is still being processed (the IETF
# idempotency-key draft), or the provider's lock timed out (both LLM SDKs retry it).
_TRANSIENT_CLIENT_STATUSES = frozenset({408, 409, 429})
_AUTH_STATUSES = frozenset({401, 403})
# 2 ** 64 times any first delay is past every cap; a larger exponent could overflow a float.
_MAX_EXPONENT = 64


class Failure(StrEnum):
    """What a failed HTTP call means for the one who made it."""

    TRANSIENT = "transient"  # passing trouble: wait (Retry-After or a backoff), then again
    AUTH = "auth"  # the credentials are missing, wrong or lack a right: no retry helps
    REFUSED = "refused"  # this request will never work as sent: no retry helps


def classify_status(status: int | None) -> Failure:
    """The meaning of an HTTP error status; None is a call that got no answer.

    None (connection refused or reset, timeout), 408, 409, 429 and 5xx but 501/505 are
    TRANSIENT; 401/403 AUTH; every other status (400, 404, 413, 422, 501, 505, ...) REFUSED.
    """
    if status is None or status in _TRANSIENT_CLIENT_STATUSES:
        return Failure.TRANSIENT
    if status in _AUTH_STATUSES:
        return Failure.AUTH
    if status >= 500 and status not in _PERMANENT_SERVER_STATUSES:
        return Failure.TRANSIENT
    return Failure.REFUSED


def retry_after_s(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The server's pause hint: ``retry-after-ms``, else ``Retry-After`` in seconds or a date.

    A negative, non-finite or unreadable value is no hint (None); a date in the past is 0.
    ``headers`` should look names up case-insensitively (httpx's do); ``now`` is the wall clock.
    """
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _seconds(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    wall_now = time.time() if now is None else now
    return max(when.timestamp() - wall_now, 0.0)


def _seconds(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class Jitter(StrEnum):
    """How much of a backoff is drawn at random, so that many waiters do not retry in step."""

    NONE = "none"  # exactly the doubled delay
    FULL = "full"  # anywhere between 0 and the doubled delay
    HALF = "half"  # between half of the doubled delay and all of it


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """A delay that doubles from ``first_s`` with each retry, capped at ``max_s``."""

    first_s: float
    max_s: float = math.inf
    jitter: Jitter = Jitter.NONE

    def delay_s(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first)."""
        ceiling = min(self.max_s, self.first_s * 2.0 ** min(max(retry, 0), _MAX_EXPONENT))
        if self.jitter is Jitter.FULL:
            return random.uniform(0.0, ceiling)
        if self.jitter is Jitter.HALF:
            return ceiling * random.uniform(0.5, 1.0)
        return float(ceiling)
