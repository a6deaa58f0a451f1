"""The worker's Redis connection shared by many threads: a full pool makes a thread wait for
a free connection (bounded) instead of failing at once. Against a real redis-server."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import MaxConnectionsError
from rq.cli.helpers import get_redis_from_config

from tests.support.workers import wait_until
from worker.redis_io import is_redis_outage, patient_redis_retry, share_between_threads

pytestmark = [pytest.mark.integration]


def rq_built(redis_url: str) -> redis.Redis:
    """The connection as ``rq worker`` builds it from REDIS_URL, with the worker's retry."""
    connection: redis.Redis = get_redis_from_config({"REDIS_URL": redis_url})
    connection.set_retry(patient_redis_retry())
    return connection


def blocked_clients(observer: redis.Redis) -> int:
    return int(observer.info("clients")["blocked_clients"])


def hold_every_connection(
    connection: redis.Redis, observer: redis.Redis, seconds: int
) -> list[threading.Thread]:
    """Two threads block in BLPOP for ``seconds``, each holding one of the two connections."""
    threads = [
        threading.Thread(target=_block, args=(connection, seconds), daemon=True) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: blocked_clients(observer) == 2, 30, "both connections in use")
    return threads


def _block(connection: redis.Redis, seconds: int) -> None:
    # A BLPOP longer than the client's socket timeout ends in a TimeoutError, often after
    # its test has ended (pytest then reports it against another test): expected here.
    with contextlib.suppress(redis.TimeoutError):
        connection.blpop(["nothing-comes"], seconds)


@pytest.fixture
def observer(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_a_thread_finding_every_connection_in_use_waits_for_one(
    redis_url: str, observer: redis.Redis
) -> None:
    plain = rq_built(redis_url)
    plain.connection_pool.max_connections = 2
    held = hold_every_connection(plain, observer, seconds=3)
    # What a concurrent worker met before: the third thread failed at once.
    with pytest.raises(MaxConnectionsError, match="Too many connections"):
        plain.set("k", "v")
    # Their BLPOPs end first: with four blocked at once, "both in use" below could be missed.
    for thread in held:
        thread.join(timeout=30)

    shared = rq_built(redis_url)
    share_between_threads(shared, max_connections=2)
    hold_every_connection(shared, observer, seconds=3)
    assert shared.set("k", "v")  # waited for a BLPOP to give its connection back
    assert observer.get("k") == b"v"
    # Same server, same retry as before the pool was made again.
    retry = shared.connection_pool.connection_kwargs["retry"]
    assert retry.get_retries() == patient_redis_retry().get_retries()


def test_a_wait_that_runs_out_fails_as_a_redis_outage(
    redis_url: str, observer: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.redis_io._connection.FREE_CONNECTION_WAIT_S", 0.5)
    shared = rq_built(redis_url)
    share_between_threads(shared, max_connections=2)
    hold_every_connection(shared, observer, seconds=20)

    with pytest.raises(redis.ConnectionError) as raised:
        shared.get("k")
    assert is_redis_outage(raised.value)


def test_sizing_never_shrinks_a_pool(redis_url: str) -> None:
    shared = rq_built(redis_url)
    share_between_threads(shared, max_connections=300)
    pool = shared.connection_pool
    share_between_threads(shared, max_connections=20)
    assert shared.connection_pool is pool
    assert pool.max_connections == 300
