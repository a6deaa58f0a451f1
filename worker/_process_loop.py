"""Connections that outlive their task: one event loop per worker process owns them.

With WORKER_CONCURRENCY > 1 each task runs in its own thread and event loop
(``anyio.run`` in ``worker.jobs``), and an httpx2 connection belongs to the loop that
opened it: a client per task loop meant a new connection (and, over HTTPS, a new TLS
handshake) to the Hub and to the model provider for every task. Here the process keeps
one loop, in a daemon thread started on first use, and on it one connection pool per
endpoint kind (the Hub, each provider endpoint). A task's client keeps its own
``httpx2.AsyncClient`` (headers, auth, timeouts: everything that is the task's) over a
``SharedTransport``: each request is sent on the process loop's pool
(``asyncio.run_coroutine_threadsafe``) and awaited on the task's loop
(``asyncio.wrap_future``), the body read chunk by chunk the same way. A pool serves at most
``TASKS_PER_POOL`` tasks in flight: a worker running more splits each endpoint's connections
over several pools, and a task thread keeps to one (httpcore scans every connection of a
pool, probing each idle one's socket, whenever a request joins or leaves it: one pool of
200 connections took a fifth of a worker's CPU at 200 tasks in flight). So:

- authority stays per call: the request, its headers (the key, traceparent, the
  idempotency key) and its timeouts are the task's; only the socket is shared;
- a task cancelled (stop-job, its deadline) cancels its own request on the process loop,
  which closes that one connection and leaves its neighbours' alone;
- a connection the server dropped while idle is found dead at reuse and replaced; a
  request that met a dropped connection before any answer is sent again once when it is
  idempotent (GET, HEAD, PUT, DELETE, OPTIONS) or carries an ``Idempotency-Key``.

The fork-per-job mode (WORKER_CONCURRENCY = 1, rq forks a job process per task) keeps
today's per-task clients: ``process_transport`` answers None in a job process, and a
process forked from one that owns the loop starts with none (``os.register_at_fork``).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import httpx2

from worker._spawn import in_job_process

_T = TypeVar("_T")
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# What a reused keep-alive connection the server closed meanwhile looks like before any
# answer arrived: the request may not have reached the server's handler.
_DROPPED = (httpx2.RemoteProtocolError, httpx2.WriteError)
# Idle connections kept this long: a warm worker's tasks arrive seconds apart.
KEEPALIVE_EXPIRY_S = 30.0
_END = object()
# A body of known length up to this size comes back with its response, in one hop.
_READ_AT_ONCE_BYTES = 1 << 20
# The tasks in flight one connection pool serves (see the module's docstring).
TASKS_PER_POOL = 8


def pool_limits(concurrency: int) -> httpx2.Limits:
    """One kept-alive connection per task in flight, room for bursts (retries, fallbacks,
    the Hub's bookkeeping calls side by side) above it."""
    return httpx2.Limits(
        max_connections=concurrency * 3 + 10,
        max_keepalive_connections=concurrency + 2,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )


class ProcessLoop:
    """The worker process's event loop for long-lived clients, in a daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transports: dict[str, httpx2.AsyncBaseTransport] = {}

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's loop thread and sockets are not ours to use."""
        self._lock = threading.Lock()
        self._loop = None
        self._transports = {}

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="process-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    async def run(
        self, work: Coroutine[Any, Any, _T], *, context: contextvars.Context | None = None
    ) -> _T:
        """Await ``work`` on the process loop; cancelling the caller cancels it there.
        With ``context`` (the caller's ``contextvars.copy_context()``) ``work`` runs in it:
        its trace context and call notes go with it."""
        if context is not None:
            work = _in_context(work, context)
        future = asyncio.run_coroutine_threadsafe(work, self.loop())
        return await asyncio.wrap_future(future)

    def transport(
        self, key: str, build: Callable[[], httpx2.AsyncBaseTransport]
    ) -> httpx2.AsyncBaseTransport:
        """The pooled transport ``key`` names, built on first use (used on this loop only)."""
        with self._lock:
            inner = self._transports.get(key)
            if inner is None:
                inner = self._transports[key] = build()
            return inner


async def _in_context(work: Coroutine[Any, Any, _T], context: contextvars.Context) -> _T:
    # Awaiting the task passes a cancellation on to it.
    return await asyncio.get_running_loop().create_task(work, context=context)


_process_loop = ProcessLoop()
os.register_at_fork(after_in_child=_process_loop.forget_after_fork)


def process_loop() -> ProcessLoop | None:
    """This process's loop for long-lived clients; None in an rq job process, whose
    clients and sessions are its one task's (the fork-per-job mode)."""
    return None if in_job_process() else _process_loop


def process_transport(
    key: str, build: Callable[[httpx2.Limits], httpx2.AsyncBaseTransport], *, concurrency: int
) -> httpx2.AsyncBaseTransport | None:
    """A transport over this process's pooled connections for ``key`` (an endpoint kind),
    ``build`` making each pool on first use with the limits it is given, for ``concurrency``
    tasks in flight; None in an rq job process, whose clients are its one task's (the
    fork-per-job mode, as before)."""
    if in_job_process():
        return None
    per_pool = min(concurrency, TASKS_PER_POOL)
    pools = max(1, -(-concurrency // TASKS_PER_POOL))
    return SharedTransport(_process_loop, key, partial(build, pool_limits(per_pool)), pools=pools)


_lanes = itertools.count()
_this_thread = threading.local()


def _thread_lane() -> int:
    """The calling thread's number, given at its first request: task threads spread evenly
    over an endpoint's pools, and one task's requests keep to one pool."""
    try:
        lane: int = _this_thread.lane
    except AttributeError:
        lane = _this_thread.lane = next(_lanes)
    return lane


class SharedTransport(httpx2.AsyncBaseTransport):
    """Sends a task's requests over the process loop's connection pools ``key`` (``pools``
    of them; the calling thread's lane picks one)."""

    def __init__(
        self,
        owner: ProcessLoop,
        key: str,
        build: Callable[[], httpx2.AsyncBaseTransport],
        *,
        pools: int = 1,
    ) -> None:
        self._owner = owner
        self._build = build
        self._keys = [key] if pools == 1 else [f"{key} #{n}" for n in range(pools)]

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        key = self._keys[_thread_lane() % len(self._keys)]
        inner = self._owner.transport(key, self._build)
        try:
            response, body = await self._owner.run(_send(inner, request))
        except _DROPPED:
            if not _replayable(request):
                raise
            response, body = await self._owner.run(_send(inner, request))
        stream = _BridgedStream(self._owner, response) if body is None else httpx2.ByteStream(body)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=stream,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Nothing to close: the pool is the process's, not the task client's."""


async def _send(
    inner: httpx2.AsyncBaseTransport, request: httpx2.Request
) -> tuple[httpx2.Response, bytes | None]:
    """The response, with its body when its length is known and small: read in the same
    hop, as every caller but a stream's reader would; a stream (no length) stays open."""
    response = await inner.handle_async_request(request)
    length = response.headers.get("content-length", "")
    if not length.isdigit() or int(length) > _READ_AT_ONCE_BYTES:
        return response, None
    try:
        return response, b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()


def _replayable(request: httpx2.Request) -> bool:
    return request.method in _IDEMPOTENT_METHODS or "idempotency-key" in request.headers


class _BridgedStream(httpx2.AsyncByteStream):
    """A response body read on the process loop, chunk by chunk, from the task's loop."""

    def __init__(self, owner: ProcessLoop, response: httpx2.Response) -> None:
        self._owner = owner
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._response.aiter_raw()
        while True:
            chunk = await self._owner.run(_next_chunk(chunks))
            if chunk is _END:
                return
            assert isinstance(chunk, bytes)
            yield chunk

    async def aclose(self) -> None:
        await self._owner.run(self._response.aclose())


async def _next_chunk(chunks: AsyncIterator[bytes]) -> object:
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return _END
