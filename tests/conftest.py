from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer, running_redis
from worker import logs


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """The JSON-line log events this process writes during the test."""
    stream = io.StringIO()
    logs.set_stream(stream)
    yield stream
    logs.set_stream(None)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server per test session, on a free port."""
    with running_redis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield redis_server.url
    client.flushall()
    client.close()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
