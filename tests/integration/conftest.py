"""Fixtures shared by the integration tests.

``stack`` (one per test process: ``e2e`` resets it for every test) is the development stack
on the session's Redis: devhub, our MCP servers and the scripted model; ``e2e`` is a test's
handle on it. Modules that need another stack define their own ``stack``. The tests that
need the whole fleet (limits at their boundaries, a Redis that refuses writes) run against
the chaos stack, whose fixtures are reused, not copied: one stack serves every such module.
"""

from collections.abc import Iterator

import pytest

from tests.chaos.conftest import chaos, chaos_stack
from tests.support.e2e import E2E
from tests.support.redis_server import RedisServer
from worker.dev.devstack import DevStack, running_stack

__all__ = ["chaos", "chaos_stack", "e2e", "stack"]


@pytest.fixture(scope="session")
def stack(redis_server: RedisServer) -> Iterator[DevStack]:
    with running_stack(redis_url=redis_server.url, scripted_llm=True) as started:
        yield started


@pytest.fixture
def e2e(stack: DevStack) -> Iterator[E2E]:
    with E2E.on(stack) as session:
        yield session
