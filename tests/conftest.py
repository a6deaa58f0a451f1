from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.fake_redis import FakeRedisClients
from tests.support.redis_server import RedisServer, running_redis
from tests.support.workers import TEST_CONCURRENCY_VARIABLE
from worker import logs
from worker.dev.devstack import PORTS_VARIABLE

# The tests that run in both worker modes: once with a forked job process per task
# (``forked``), once with every worker running its tasks in threads (``concurrent``,
# WORKER_CONCURRENCY=4). Paths are files or folders, relative to the repository.
BOTH_WORKER_MODES = (
    "tests/chaos",
    "tests/conformance",
    "tests/integration/test_worker_e2e.py",
    "tests/integration/test_agent_worker.py",
    "tests/integration/test_settling.py",
    "tests/integration/test_redis_refusals.py",
    "tests/integration/test_tracing.py",
)
# Inside BOTH_WORKER_MODES, the modules that set WORKER_CONCURRENCY on every worker they start
# themselves: a second mode would run the same test again.
OWN_WORKER_MODE = (
    "tests/chaos/test_concurrent.py",
    "tests/chaos/test_prometheus_server.py",  # its pool sets --concurrency itself
    "tests/conformance/test_pool.py",
    "tests/chaos/test_shared_sessions.py",
)
CONCURRENT_MODE_CONCURRENCY = "4"
_REPO_ROOT = Path(__file__).resolve().parents[1]


def runs_in_both_worker_modes(path: Path) -> bool:
    if any(path == _REPO_ROOT / entry for entry in OWN_WORKER_MODE):
        return False
    return any(path.is_relative_to(_REPO_ROOT / entry) for entry in BOTH_WORKER_MODES)


def pytest_configure(config: pytest.Config) -> None:
    # Each pytest-xdist process ("gw0", "gw1", ...) starts its servers on ports of its own
    # block, below the kernel's ephemeral range (worker.dev.devstack.free_port).
    process = os.environ.get("PYTEST_XDIST_WORKER", "")
    if process[2:].isdigit():
        low = 20_000 + 500 * int(process[2:])
        os.environ[PORTS_VARIABLE] = f"{low}-{low + 499}"
    else:
        os.environ.setdefault(PORTS_VARIABLE, "10000-19999")
    config.addinivalue_line(
        "markers", "both_worker_modes: in BOTH_WORKER_MODES (`make test-concurrent` runs these)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if runs_in_both_worker_modes(item.path):
            item.add_marker(pytest.mark.both_worker_modes)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # With AGENT_TEST_WORKER_CONCURRENCY set, every worker of the run already has that mode.
    if os.environ.get(TEST_CONCURRENCY_VARIABLE) or not runs_in_both_worker_modes(
        metafunc.definition.path
    ):
        return
    metafunc.parametrize("worker_mode", ["forked", "concurrent"], indirect=True)


@pytest.fixture(autouse=True)
def worker_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The worker mode of a test in BOTH_WORKER_MODES; None for any other test."""
    mode: str | None = getattr(request, "param", None)
    if mode == "forked":
        monkeypatch.delenv(TEST_CONCURRENCY_VARIABLE, raising=False)
    elif mode == "concurrent":
        monkeypatch.setenv(TEST_CONCURRENCY_VARIABLE, CONCURRENT_MODE_CONCURRENCY)
    return mode


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


@pytest.fixture
def fake_redis() -> Iterator[FakeRedisClients]:
    """Builds fakeredis clients for the test (``fake_redis()``) and closes them after it."""
    clients = FakeRedisClients()
    yield clients
    clients.close()
