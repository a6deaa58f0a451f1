"""worker.redis_io._connection: one factory for rq's connection and ours, plain or Sentinel-managed.

No server is contacted here: building a client (plain or Sentinel) is lazy.
The failover itself is tests/integration/test_sentinel.py.
"""

from __future__ import annotations

import importlib
import sys

import pytest
from redis import Redis

from worker.exceptions import ConfigurationError
from worker.redis_io import connect, require_matching_worker_connection, rq_connection_settings
from worker.redis_io._connection import (
    SentinelPrimaryConnection,
    SentinelPrimarySSLConnection,
    is_sentinel_managed,
    parse_sentinel_addresses,
)
from worker.settings import Settings, load_settings

SENTINELS = "10.0.0.1:26379, sentinel-b:26380,[::1]:26381"


def sentinel_settings(**overrides: str) -> Settings:
    values = {
        "redis_url": "redis://:primary-password@ignored-host:1/3",
        "redis_sentinels": SENTINELS,
        "redis_sentinel_master": "fleet",
        **overrides,
    }
    return Settings(**values)  # type: ignore[arg-type]


def test_sentinel_addresses_parse_with_ipv6_and_spaces() -> None:
    assert parse_sentinel_addresses(SENTINELS) == [
        ("10.0.0.1", 26379),
        ("sentinel-b", 26380),
        ("::1", 26381),
    ]


@pytest.mark.parametrize(
    "value", ["sentinel-a", "sentinel-a:", ":26379", "a:port", "a:70000", " , "]
)
def test_a_bad_sentinel_list_fails_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("REDIS_SENTINELS", value)
    with pytest.raises(ConfigurationError, match="invalid setting REDIS_SENTINELS:"):
        load_settings()


def test_without_sentinels_rq_and_we_use_redis_url() -> None:
    settings = Settings(redis_url="redis://cache.internal:6380/2")
    assert rq_connection_settings(settings) == {
        "REDIS_URL": "redis://cache.internal:6380/2",
        "SENTINEL": None,
    }
    client = connect(settings)
    assert not is_sentinel_managed(client)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.internal", 6380, 2)


def test_with_sentinels_redis_url_gives_only_credentials_and_database() -> None:
    sentinel = rq_connection_settings(sentinel_settings())["SENTINEL"]
    assert sentinel["INSTANCES"] == parse_sentinel_addresses(SENTINELS)
    assert sentinel["MASTER_NAME"] == "fleet"
    assert (sentinel["DB"], sentinel["PASSWORD"], sentinel["SSL"]) == (3, "primary-password", False)
    assert "password" not in sentinel["SENTINEL_KWARGS"]


def test_connect_builds_a_sentinel_managed_primary_with_our_connection_class() -> None:
    client = connect(sentinel_settings(redis_sentinel_password="sentinel-secret"))
    assert is_sentinel_managed(client)
    pool = client.connection_pool
    assert pool.connection_class is SentinelPrimaryConnection
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (
        3,
        "primary-password",
    )
    sentinel_pools = [s.connection_pool for s in pool.sentinel_manager.sentinels]  # type: ignore[attr-defined]
    assert [(p.connection_kwargs["host"], p.connection_kwargs["port"]) for p in sentinel_pools] == (
        parse_sentinel_addresses(SENTINELS)
    )
    assert {p.connection_kwargs.get("password") for p in sentinel_pools} == {"sentinel-secret"}


def test_tls_urls_give_the_tls_connection_class() -> None:
    client = connect(sentinel_settings(redis_url="rediss://:pw@ignored:1/0"))
    assert client.connection_pool.connection_class is SentinelPrimarySSLConnection


def test_the_sentinel_password_is_a_secret_to_redact() -> None:
    settings = sentinel_settings(redis_sentinel_password="sentinel-secret")
    assert "sentinel-secret" in settings.secret_values()
    assert "sentinel-secret" not in repr(settings)


def test_a_worker_refuses_a_plain_connection_when_sentinels_are_set() -> None:
    plain = Redis.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError, match=r"RQ_CONFIG=worker\.rq_config"):
        require_matching_worker_connection(plain, sentinel_settings())
    require_matching_worker_connection(plain, Settings())
    require_matching_worker_connection(connect(sentinel_settings()), sentinel_settings())


def test_rq_config_module_hands_rq_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from rq.cli.helpers import get_redis_from_config, read_config_file

    monkeypatch.setenv("REDIS_SENTINELS", SENTINELS)
    monkeypatch.setenv("REDIS_SENTINEL_MASTER", "fleet")
    monkeypatch.setattr("worker.settings.settings", lambda: load_settings())
    # The sentinels named here are nobody's: the module's start-up PING must not go out.
    monkeypatch.setattr("worker.redis_io.check_redis_access", lambda connection: None)
    sys.modules.pop("worker.rq_config", None)
    importlib.import_module("worker.rq_config")

    rq_settings = read_config_file("worker.rq_config")
    client = get_redis_from_config(rq_settings)
    assert rq_settings["REDIS_URL"] is None
    assert is_sentinel_managed(client)
    assert client.connection_pool.service_name == "fleet"  # type: ignore[attr-defined]
    sys.modules.pop("worker.rq_config", None)
