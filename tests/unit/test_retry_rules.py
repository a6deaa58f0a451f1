"""The one owner of "what a failed HTTP call means": statuses, Retry-After and backoff."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import httpx2
import pytest

from hub_client.retry_rules import Backoff, Failure, Jitter, classify_status, retry_after_s


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        (None, Failure.TRANSIENT),
        (408, Failure.TRANSIENT),
        (409, Failure.TRANSIENT),
        (429, Failure.TRANSIENT),
        (500, Failure.TRANSIENT),
        (502, Failure.TRANSIENT),
        (503, Failure.TRANSIENT),
        (504, Failure.TRANSIENT),
        (529, Failure.TRANSIENT),
        (401, Failure.AUTH),
        (403, Failure.AUTH),
        (400, Failure.REFUSED),
        (404, Failure.REFUSED),
        (413, Failure.REFUSED),
        (422, Failure.REFUSED),
        (501, Failure.REFUSED),
        (505, Failure.REFUSED),
    ],
)
def test_each_status_has_one_meaning(status: int | None, failure: Failure) -> None:
    assert classify_status(status) is failure


NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
IN_30_S = format_datetime(datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "12"}, 12.0),
        ({"retry-after": " 0.25 "}, 0.25),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "250", "retry-after": "12"}, 0.25),
        ({"retry-after": IN_30_S}, 30.0),
        ({}, None),
    ],
)
def test_retry_after_reads_seconds_milliseconds_and_dates(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after_s(headers, now=NOW) == seconds


@pytest.mark.parametrize("value", ["-5", "soon", "", "nan", "inf", "-inf", "12s", "Mon, 99 Foo"])
def test_a_negative_or_unreadable_retry_after_is_no_hint(value: str) -> None:
    assert retry_after_s({"retry-after": value}, now=NOW) is None


def test_an_unreadable_retry_after_ms_falls_back_to_retry_after() -> None:
    assert retry_after_s({"retry-after-ms": "-1", "retry-after": "3"}, now=NOW) == 3.0
    assert retry_after_s({"retry-after-ms": "soon", "retry-after": "3"}, now=NOW) == 3.0


def test_a_retry_after_date_in_the_past_means_now() -> None:
    assert retry_after_s({"retry-after": IN_30_S}, now=NOW + 90) == 0.0


def test_retry_after_names_are_read_case_insensitively_from_http_headers() -> None:
    headers = httpx2.Headers({"Retry-After": "7", "Retry-After-Ms": "1500"})
    assert retry_after_s(headers) == 1.5
    assert retry_after_s(httpx2.Headers({"RETRY-AFTER": "7"})) == 7.0


def test_a_backoff_doubles_from_its_first_delay_up_to_its_cap() -> None:
    backoff = Backoff(first_s=0.5, max_s=5.0)
    assert [backoff.delay_s(retry) for retry in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_backoff_without_a_cap_keeps_doubling_and_never_overflows() -> None:
    assert Backoff(first_s=30.0).delay_s(3) == 240.0
    assert Backoff(first_s=1.0, max_s=3600.0).delay_s(10_000) == 3600.0
    assert Backoff(first_s=1.0).delay_s(-1) == 1.0


@pytest.mark.parametrize(
    ("jitter", "low", "high"), [(Jitter.FULL, 0.0, 8.0), (Jitter.HALF, 4.0, 8.0)]
)
def test_jitter_draws_within_its_share_of_the_delay(
    jitter: Jitter, low: float, high: float
) -> None:
    backoff = Backoff(first_s=1.0, max_s=8.0, jitter=jitter)
    draws = [backoff.delay_s(5) for _ in range(500)]
    assert all(low <= draw <= high for draw in draws)
    assert max(draws) - min(draws) > (high - low) / 2  # really drawn, not one fixed value
