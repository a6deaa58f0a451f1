"""One factory for every Redis connection of the fleet: a plain URL or a Sentinel-managed primary.

Use ``connect()`` wherever our code needs Redis outside a job (the CLI, the
scheduler, status, enqueue). Inside a job, use the connection rq gave the job.

rq's CLI builds the worker's connection itself, before our worker class runs
(``rq worker`` asks Redis whether it is suspended first), from ``--url`` /
``RQ_REDIS_URL``, a settings module (``-c`` / ``RQ_CONFIG``) or ``REDIS_URL``.
``RQ_CONFIG=worker.rq_config`` hands rq the dict of ``rq_connection_settings()``,
and ``connect()`` builds its client from the same dict with rq's own helper, so
the worker, its job processes and rq's scheduler process (which rebuilds the
worker's pool) use one Redis, chosen one way:

- ``REDIS_SENTINELS`` unset: ``REDIS_URL``, as before;
- ``REDIS_SENTINELS=host:port,host:port`` (and ``REDIS_SENTINEL_MASTER``): the
  primary the sentinels name, asked again after every connection error, so a
  failover is another short Redis outage that the worker's retries ride out.
  ``REDIS_URL`` then gives only the credentials, database and TLS (``rediss://``)
  of the data nodes; its host and port are not used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis import BlockingConnectionPool, Redis
from redis.connection import SSLConnection, parse_url
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

from worker._network import parse_sentinel_addresses
from worker.exceptions import ConfigurationError

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "FREE_CONNECTION_WAIT_S",
    "SentinelPrimaryConnection",
    "SentinelPrimarySSLConnection",
    "connect",
    "is_sentinel_managed",
    "parse_sentinel_addresses",
    "require_matching_worker_connection",
    "rq_connection_settings",
    "share_between_threads",
]

RQ_CONFIG_MODULE = "worker.rq_config"
# A sentinel that does not answer must not stall the search for the primary: the next one may.
SENTINEL_SOCKET_TIMEOUT_S = 2.0
# Connecting to the primary the sentinels named; the command itself keeps redis-py's default.
PRIMARY_CONNECT_TIMEOUT_S = 5.0
# How long a thread waits for a free connection of a full pool: about as long as a command
# waits out an outage (``patient_redis_retry``); then it fails as an outage does.
FREE_CONNECTION_WAIT_S = 30.0


class SentinelPrimaryConnection(SentinelManagedConnection):
    """redis-py's Sentinel connection with two fixes (redis-py 8.1) that a failover needs.

    - A reconnect asks the sentinels again. redis-py's ``send_packed_command``
      reconnects a dropped connection through ``connect_check_health``, straight
      to the address it last had: after a failover, a command retried there
      knocked on the dead primary until its retries ran out (~33 s), and the task
      failed instead of moving to the new primary.
    - An interrupted read drops the connection, as a plain ``Connection`` does
      (redis-py reads here with ``disconnect_on_error=False``). rq's warm shutdown
      raises from its SIGTERM handler while an idle worker blocks in BLMOVE: the
      connection went back to the pool with the blocking command pending, and the
      worker's next command (``register_death``) waited behind it for the whole
      dequeue timeout.
    """

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if retry_socket_connect:
            # Not from connect_to(): go through connect(), which asks the sentinels.
            self.connect()  # type: ignore[no-untyped-call]
            return
        super().connect_check_health(check_health=check_health, retry_socket_connect=False)

    def read_response(
        self,
        disable_decoding: bool = False,
        *,
        disconnect_on_error: bool | None = True,
        **kwargs: Any,
    ) -> Any:
        return super().read_response(
            disable_decoding=disable_decoding, disconnect_on_error=disconnect_on_error, **kwargs
        )


class SentinelPrimarySSLConnection(SentinelPrimaryConnection, SSLConnection):
    """The same over TLS (``rediss://`` in ``REDIS_URL``)."""


def rq_connection_settings(settings: Settings) -> dict[str, Any]:
    """The connection part of an rq settings module: ``REDIS_URL`` or ``SENTINEL``.

    The ``SENTINEL`` keys are the ones rq's ``get_redis_from_config`` reads.
    """
    if not settings.redis_sentinels:
        return {"REDIS_URL": settings.redis_url, "SENTINEL": None}
    try:
        url = parse_url(settings.redis_url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ConfigurationError(f"invalid setting REDIS_URL: {exc}") from None
    tls = settings.redis_url.startswith("rediss://")
    connection_class = SentinelPrimarySSLConnection if tls else SentinelPrimaryConnection
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT_S,
    }
    if settings.redis_sentinel_password is not None:
        sentinel_kwargs["password"] = settings.redis_sentinel_password.get_secret_value()
    return {
        "REDIS_URL": None,
        "SENTINEL": {
            "INSTANCES": parse_sentinel_addresses(settings.redis_sentinels),
            "MASTER_NAME": settings.redis_sentinel_master,
            "DB": url.get("db", 0),
            "USERNAME": url.get("username"),
            "PASSWORD": url.get("password"),
            "SSL": tls,
            "CONNECTION_KWARGS": {
                "socket_connect_timeout": PRIMARY_CONNECT_TIMEOUT_S,
                "connection_class": connection_class,
            },
            "SENTINEL_KWARGS": sentinel_kwargs,
        },
    }


def connect(settings: Settings | None = None) -> Redis:
    """A client to the fleet's Redis, built exactly as ``rq worker`` builds the worker's."""
    if settings is None:
        from worker.settings import settings_or_exit

        settings = settings_or_exit()
    # rq's CLI helpers load all of rq; only the callers that connect pay for it.
    from rq.cli.helpers import get_redis_from_config

    rq_settings = rq_connection_settings(settings)
    connection: Redis = get_redis_from_config(rq_settings)  # type: ignore[no-untyped-call]
    return connection


def is_sentinel_managed(connection: Redis) -> bool:
    return isinstance(connection.connection_pool, SentinelConnectionPool)


def require_matching_worker_connection(connection: Redis, settings: Settings) -> None:
    """Refuse a worker whose rq connection ignores ``REDIS_SENTINELS``.

    Without ``RQ_CONFIG=worker.rq_config`` rq connects to ``REDIS_URL``, which is
    only a template of credentials once sentinels are set: a worker there would
    serve another Redis than the fleet's.
    """
    if settings.redis_sentinels and not is_sentinel_managed(connection):
        raise ConfigurationError(
            "invalid setting REDIS_SENTINELS: rq built a plain Redis connection; start the "
            f"worker with RQ_CONFIG={RQ_CONFIG_MODULE} and without RQ_REDIS_URL or --url"
        )


def share_between_threads(connection: Redis, *, max_connections: int) -> None:
    """Let up to ``max_connections`` threads use ``connection`` at once, and more wait.

    redis-py's plain pool refuses a connection past its ``max_connections`` at once
    ("Too many connections"), which no retry covers. The worker's pool becomes redis-py's
    ``BlockingConnectionPool`` of the same connections: a thread that finds every one in
    use waits up to ``FREE_CONNECTION_WAIT_S`` for one, then gets a ``ConnectionError``
    that the outage handling treats as Redis being away. A Sentinel-managed pool keeps
    its class (redis-py has no blocking variant) and is only sized. Call it before other
    threads use the connection.
    """
    pool = connection.connection_pool
    current = getattr(pool, "max_connections", None)
    if is_sentinel_managed(connection):
        if isinstance(current, int) and current < max_connections:
            pool.max_connections = max_connections
        return
    if isinstance(pool, BlockingConnectionPool) and (current or 0) >= max_connections:
        return
    # rq's own recipe for rebuilding a worker's connection (its worker pool and scheduler).
    from rq.connections import get_connection_kwargs

    connection.connection_pool = BlockingConnectionPool(  # type: ignore[no-untyped-call]
        connection_class=pool.connection_class,
        max_connections=max_connections,
        timeout=FREE_CONNECTION_WAIT_S,
        **get_connection_kwargs(connection),
    )
    pool.disconnect()
