"""The process loop's shared connections (worker._process_loop), against a real HTTP/1.1
server on loopback: tasks in their own threads and event loops share one pool, each
request carries its own task's authority, a cancelled request leaves its neighbours'
alone, and a connection the server dropped is replayed only when that is safe."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import anyio
import httpx2
import pytest

from worker._process_loop import (
    TASKS_PER_POOL,
    ProcessLoop,
    SharedTransport,
    pool_limits,
    process_transport,
)
from worker.dev.post_proxy import LoopbackServer, serving


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        with self.server.lock:
            self.server.ports.append(self.client_address[1])
            self.server.seen += 1
            first_drop = self.path == "/drop-once" and not self.server.dropped
            if first_drop:
                self.server.dropped = True
        if first_drop:  # the connection closes without an answer
            self.close_connection = True
            return
        if self.path == "/slow":
            time.sleep(2.0)
        self._answer((self.headers.get("Authorization") or "").encode())

    do_GET = do_POST = _handle


class _Server(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.lock = threading.Lock()
        self.ports: list[int] = []
        self.seen = 0
        self.dropped = False


@pytest.fixture
def server() -> Iterator[_Server]:
    with serving(_Server()) as httpd:
        yield httpd


@pytest.fixture
def shared() -> SharedTransport:
    return SharedTransport(
        ProcessLoop(), "test", lambda: httpx2.AsyncHTTPTransport(limits=pool_limits(2))
    )


def _in_task_thread(work: Any) -> threading.Thread:
    """``work`` in a thread of its own with its own event loop, as a job thread runs a task."""
    thread = threading.Thread(target=anyio.run, args=(work,))
    thread.start()
    return thread


def test_tasks_in_their_own_loops_reuse_the_process_pool_each_with_its_own_key(
    server: _Server, shared: SharedTransport
) -> None:
    answers: dict[str, list[str]] = {}

    def task(key: str) -> Any:
        async def run() -> None:
            headers = {"Authorization": key}
            async with httpx2.AsyncClient(transport=shared, headers=headers) as client:
                for _ in range(3):
                    response = await client.get(f"{server.url}/answer")
                    answers.setdefault(key, []).append(response.text)

        return run

    for n in range(4):  # one after another, as tasks arrive at a warm worker
        _in_task_thread(task(f"key-{n}")).join()

    # Each request carried its own task's key, never another's...
    assert answers == {f"key-{n}": [f"key-{n}"] * 3 for n in range(4)}
    # ...over one connection kept alive across the tasks and their ended loops.
    assert len(set(server.ports)) == 1


class _CountedPool(httpx2.AsyncHTTPTransport):
    """A pool that keeps the Authorization of every request sent over it."""

    def __init__(self, limits: httpx2.Limits) -> None:
        super().__init__(limits=limits)
        self.limits = limits
        self.callers: set[str] = set()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.callers.add(request.headers.get("Authorization", ""))
        return await super().handle_async_request(request)


def test_many_tasks_in_flight_spread_over_pools_and_each_task_keeps_to_one(
    server: _Server,
) -> None:
    pools: list[_CountedPool] = []

    def build(limits: httpx2.Limits) -> httpx2.AsyncBaseTransport:
        pools.append(_CountedPool(limits))
        return pools[-1]

    # As a worker with WORKER_CONCURRENCY=20 gets it (a job process gets None).
    transport = process_transport("spread", build, concurrency=2 * TASKS_PER_POOL + 4)
    assert transport is not None
    started = threading.Barrier(6)

    def task(key: str) -> Any:
        async def run() -> None:
            started.wait()  # all six in flight at once
            headers = {"Authorization": key}
            async with httpx2.AsyncClient(transport=transport, headers=headers) as client:
                for _ in range(3):
                    await client.get(f"{server.url}/answer")

        return run

    threads = [_in_task_thread(task(f"task-{n}")) for n in range(6)]
    for thread in threads:
        thread.join(10)

    # Three pools, each sized for the tasks one pool serves, two tasks each; every request
    # of a task went over its one pool.
    assert server.seen == 18
    assert [len(pool.callers) for pool in pools] == [2, 2, 2]
    assert set().union(*(pool.callers for pool in pools)) == {f"task-{n}" for n in range(6)}
    assert {pool.limits.max_keepalive_connections for pool in pools} == {TASKS_PER_POOL + 2}


def test_a_cancelled_request_leaves_the_neighbours_request_alone(
    server: _Server, shared: SharedTransport
) -> None:
    results: dict[str, Any] = {}

    async def neighbour() -> None:
        async with httpx2.AsyncClient(transport=shared, headers={"Authorization": "b"}) as c:
            results["b"] = (await c.get(f"{server.url}/slow")).text

    async def cancelled() -> None:
        async with httpx2.AsyncClient(transport=shared, headers={"Authorization": "a"}) as c:
            with anyio.move_on_after(0.5) as scope:  # the task's deadline, or stop-job
                await c.get(f"{server.url}/slow")
            results["a"] = scope.cancelled_caught

    threads = [_in_task_thread(neighbour), _in_task_thread(cancelled)]
    for thread in threads:
        thread.join(10)
    assert results == {"a": True, "b": "b"}


def test_a_dropped_connection_is_replayed_once_for_a_keyed_request_only(
    server: _Server, shared: SharedTransport
) -> None:
    async def post(headers: dict[str, str]) -> str:
        async with httpx2.AsyncClient(transport=shared) as client:
            return (await client.post(f"{server.url}/drop-once", json={}, headers=headers)).text

    # A POST that is not keyed may have reached the handler: it is not sent again.
    with pytest.raises(httpx2.RemoteProtocolError):
        anyio.run(post, {})
    assert server.seen == 1

    server.dropped = False
    keyed = {"Idempotency-Key": "k-1", "Authorization": "keyed"}
    assert anyio.run(post, keyed) == "keyed"
    assert server.seen == 3  # the dropped one, and its one replay


def test_a_forked_child_starts_without_its_parents_loop_or_connections(
    server: _Server,
) -> None:
    owner = ProcessLoop()
    transport = SharedTransport(owner, "test", httpx2.AsyncHTTPTransport)

    async def get() -> None:
        async with httpx2.AsyncClient(transport=transport) as client:
            await client.get(f"{server.url}/answer")

    anyio.run(get)
    parent_loop = owner.loop()
    os.register_at_fork(after_in_child=owner.forget_after_fork)
    pid = os.fork()
    if pid == 0:  # the child: a loop and a pool of its own, opened on first use
        own = httpx2.MockTransport(lambda request: httpx2.Response(204))
        fresh = owner.loop() is not parent_loop and owner.transport("test", lambda: own) is own
        os._exit(0 if fresh else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
