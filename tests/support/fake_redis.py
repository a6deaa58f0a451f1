"""fakeredis clients for tests that need Redis semantics but no server (the ``fake_redis``
fixture of tests/conftest.py hands out one ``FakeRedisClients`` per test).

``fake_redis()`` is a client on a server of its own; ``fake_redis(server=shared)`` one on
``shared`` (a ``fakeredis.FakeServer``). Every client is closed when the test ends.
"""

from __future__ import annotations

from typing import Any

import fakeredis


class FakeRedisClients:
    """Builds fakeredis clients and closes every one it built."""

    def __init__(self) -> None:
        self._clients: list[fakeredis.FakeRedis] = []

    def __call__(self, **options: Any) -> fakeredis.FakeRedis:
        client = fakeredis.FakeRedis(**options)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
