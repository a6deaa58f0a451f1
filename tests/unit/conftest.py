"""Fixtures of the unit tests."""

from __future__ import annotations

import fakeredis
import pytest

from tests.support.fake_redis import FakeRedisClients


@pytest.fixture
def redis(fake_redis: FakeRedisClients) -> fakeredis.FakeRedis:
    """A unit test's Redis: a fakeredis client on a server of its own, closed after the test."""
    return fake_redis()
