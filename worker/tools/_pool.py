"""Pooled stdio MCP servers: started once per worker process and shared by its tasks.

A stdio server marked ``pool: true`` in MCP_CONFIG costs a task about a millisecond
instead of a process start (~0.5-1 s). Use ``stdio_pool().session(...)`` from a task's
toolbox; ``close_stdio_pool()`` stops every pooled server (the worker calls it at shutdown,
and it also runs at interpreter exit).

Threads. With WORKER_CONCURRENCY > 1 the tasks of one process run in several threads, each
with its own event loop. The pool owns its servers on an event loop of its own, in a daemon
thread started on first use (never at import). A task's calls run on that loop
(``asyncio.run_coroutine_threadsafe``) and are awaited on the task's loop
(``asyncio.wrap_future``), so the task's timeout or cancellation cancels its call on the
server's side too. One MCP session per server carries every task's requests at once.

Identity. The process is shared, so who calls goes per call, as for HTTP servers: each
call's ``_meta`` carries the task's agent, task, idempotency key, deadline and (first-party
servers) capability. A pooled server's ``env`` is seen by every agent that may call it.

Crashes. A server that exits, or does not answer ``initialize`` within the connect timeout
of the task that started it, is stopped and started again by the next task that needs it;
the tasks using it meet "server down, tools withdrawn" as with a per-task server. From the
moment it starts to close, no task is handed it: a task arriving then waits until it is
gone and starts the next one. After repeated crashes (each within ``HEALTHY_AFTER_S`` of
its start) the restart waits a backoff that doubles up to ``MAX_BACKOFF_S``; a task asking
meanwhile finds the server withdrawn.

Owner. The pool belongs to the process that started its servers: a process forked from it
(``os.register_at_fork``) neither uses nor stops them and starts its own. The worker stops
its pool as it exits (``close_stdio_pool``), a bounded wait: a server stuck at start-up is
cancelled, and every server is killed once its grace is over.

Children. Pooled servers outlive the job that started them, so they are not recorded
for the per-job process-group cleanup (``register_child_process``): the pool kills them
itself, in ``close``. In an rq job process (WORKER_CONCURRENCY = 1: rq forks one per job,
and ends it with ``os._exit``, no atexit; ``worker._spawn``) the pool lives and dies
with that one job: there the pool hands its children to the job's ``on_spawn`` like a
per-task server's, so the worker kills them after the job. The workers ``rq worker-pool``
forks each keep their pool for all their jobs. Pooling pays off with WORKER_CONCURRENCY > 1.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import mcp_types
from mcp.client import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from hub_client.retry_rules import Backoff
from worker._spawn import SpawnHook, ignore_spawn, in_job_process
from worker.logs import log_event
from worker.tools._config import McpServerConfig
from worker.tools._links import CLIENT_INFO, describe_failure
from worker.tools._tool_cache import tool_lists
from worker.tools._transports import stdio_streams

# A server that ran this long before it exited was healthy: its crash count starts over.
HEALTHY_AFTER_S = 60.0
MAX_BACKOFF_S = 30.0
_CRASH_BACKOFF = Backoff(first_s=0.5, max_s=MAX_BACKOFF_S)
# Stopping closes each server's stdin, waits, then kills its group (about 4 s at worst).
_CLOSE_TIMEOUT_S = 10.0

_T = TypeVar("_T")
_ServerKey = tuple[str, str, int]


class PooledServerBackingOff(RuntimeError):
    """The pooled server crashed repeatedly; it is not started again before its backoff."""


@dataclass(eq=False)
class _Crashes:
    """How often a pooled server exited soon after its start, and when it may start again."""

    in_a_row: int = 0
    retry_at: float = 0.0

    def record(self, uptime_s: float) -> None:
        self.in_a_row = 1 if uptime_s >= HEALTHY_AFTER_S else self.in_a_row + 1
        # The first crash restarts at once: one bad call should not cost the next task.
        delay = 0.0 if self.in_a_row < 2 else _CRASH_BACKOFF.delay_s(self.in_a_row - 2)
        self.retry_at = time.monotonic() + delay

    def check(self, name: str) -> None:
        wait_s = self.retry_at - time.monotonic()
        if wait_s > 0:
            raise PooledServerBackingOff(
                f"pooled server {name!r} crashed {self.in_a_row} times in a row; "
                f"next start in {wait_s:.1f} s"
            )


@dataclass(eq=False)
class _PooledServer:
    """One running server process and its MCP session; lives on the pool's loop only."""

    name: str
    config: McpServerConfig
    max_result_bytes: int
    started_at: float = field(default_factory=time.monotonic)
    client: Client | None = None
    pid: int | None = None
    failure: str | None = None
    # Stopped by the pool's close, not by a crash.
    retired: bool = False
    ready: anyio.Event = field(default_factory=anyio.Event)
    # Set once the server starts to close (it exited, or the pool stops it): never handed out.
    stop: anyio.Event = field(default_factory=anyio.Event)
    # Set once its process is stopped and its exit counted (``StdioPool._hold``).
    gone: anyio.Event = field(default_factory=anyio.Event)
    # Cancels the start-up: a server stuck before answering ``initialize``.
    _start: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    async def run(self, pids: set[int], on_spawn: SpawnHook) -> None:
        """Hold the server open until it exits or the pool closes; ``pids`` tracks it."""

        def spawned(pid: int) -> None:
            self.pid = pid
            pids.add(pid)
            on_spawn(pid)

        transport = stdio_streams(
            self.name,
            self.config,
            max_result_bytes=self.max_result_bytes,
            on_spawn=spawned,
            on_exit=self.stop.set,
        )
        try:
            with self._start:
                async with Client(
                    transport, mode="auto", cache=None, client_info=CLIENT_INFO
                ) as client:
                    self.client = client
                    self.ready.set()
                    await self.stop.wait()
        except Exception as exc:
            self.failure = describe_failure(exc)
        finally:
            self.stop.set()
            self.client = None
            if self.pid is not None:
                pids.discard(self.pid)
            self.ready.set()

    def abort_start(self, failure: str) -> None:
        """Stop a server that has not answered ``initialize``; a running one is left alone."""
        if not self.ready.is_set():
            self.failure = failure
            self.stop.set()
            self._start.cancel()

    @property
    def usable(self) -> bool:
        return not self.stop.is_set()

    def live_client(self) -> Client:
        if self.client is None or self.stop.is_set():
            raise MCPError(CONNECTION_CLOSED, f"pooled server {self.name!r} exited")
        return self.client


class PooledSession:
    """One task's use of a pooled server: calls run on the pool's loop, awaited on the task's.

    It has the ``call_tool``/``list_tools`` of an MCP ``Client``, so a link uses either alike.
    """

    def __init__(self, pool: StdioPool, server: _PooledServer) -> None:
        self._pool = pool
        self._server = server

    @property
    def pid(self) -> int | None:
        return self._server.pid

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        meta: mcp_types.RequestParamsMeta | None = None,
    ) -> mcp_types.CallToolResult:
        server = self._server

        async def call() -> mcp_types.CallToolResult:
            return await server.live_client().call_tool(name, arguments, meta=meta)

        return await self._pool.run(call())

    async def list_tools(self, *, cursor: str | None = None) -> mcp_types.ListToolsResult:
        server = self._server

        async def listing() -> mcp_types.ListToolsResult:
            return await server.live_client().list_tools(cursor=cursor)

        return await self._pool.run(listing())

    async def wait_closing(self) -> None:
        """Return when the server starts to close: its process exited, or the pool stops it."""
        await self._pool.run(self._server.stop.wait())


class StdioPool:
    """The pooled stdio servers of this process. Use the one ``stdio_pool()`` returns."""

    def __init__(self, *, job_scoped: bool | None = None) -> None:
        # None: decided by the process, a job process (forked after the tools loaded) or not.
        self._job_scoped = job_scoped
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._owner_pid = os.getpid()
        self._closes_at_exit = False
        # Touched on the pool's loop only.
        self._servers: dict[_ServerKey, _PooledServer] = {}
        self._crashes: dict[_ServerKey, _Crashes] = {}
        self._pids: set[int] = set()

    async def session(
        self,
        name: str,
        config: McpServerConfig,
        *,
        max_result_bytes: int,
        start_timeout_s: float,
        on_spawn: SpawnHook = ignore_spawn,
    ) -> PooledSession:
        """From a task's loop: a session on the running server, which starts if need be.

        A server started now that has not answered ``initialize`` within ``start_timeout_s``
        is stopped, and counts as a crash. ``on_spawn`` (the task's child-process record)
        hears of a server started now only when the pool lives as long as the job
        (``job_scoped``).
        """
        spawn_hook = on_spawn if self.job_scoped else ignore_spawn
        server = await self.run(
            self._ready_server(name, config, max_result_bytes, start_timeout_s, spawn_hook)
        )
        return PooledSession(self, server)

    @property
    def job_scoped(self) -> bool:
        """Whether this pool lives only as long as one job: in an rq job process."""
        return in_job_process() if self._job_scoped is None else self._job_scoped

    def child_pids(self) -> set[int]:
        """The process ids (= process groups) of the pooled servers now running."""
        return set(self._pids)

    async def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Await ``work`` on the pool's loop from any other loop; cancelling cancels it there."""
        try:
            future = asyncio.run_coroutine_threadsafe(work, self._pool_loop())
        except RuntimeError:  # the loop closed under us (the pool is closing)
            work.close()
            raise
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop every pooled server and the pool's thread; the next use starts afresh.

        Call it from any thread but the pool's own (the worker at shutdown; atexit).
        """
        # A forked child inherits this object and its atexit hook, not its servers (nor its
        # lock's state: another thread may have held it at the fork).
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        stopping = asyncio.run_coroutine_threadsafe(self._stop_all(), loop)
        try:
            stopping.result(_CLOSE_TIMEOUT_S)
        except (FutureTimeout, CancelledError, RuntimeError) as exc:
            log_event("mcp_pool_close_slow", "warning", error=describe_failure(exc))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_TIMEOUT_S)
        for pid in list(self._pids):  # what did not stop in time
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._pids.clear()
        self._servers.clear()
        self._crashes.clear()
        if not thread.is_alive():
            loop.close()

    def _pool_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="mcp-stdio-pool", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                if not self._closes_at_exit:
                    atexit.register(self.close)
                    self._closes_at_exit = True
            return self._loop

    async def _ready_server(
        self,
        name: str,
        config: McpServerConfig,
        max_result_bytes: int,
        start_timeout_s: float,
        on_spawn: SpawnHook,
    ) -> _PooledServer:
        key = (name, config.identity(name), max_result_bytes)
        server = self._servers.get(key)
        while server is not None and not server.usable:
            # Closing: its crash is counted once it is gone, then the next one may start.
            await server.gone.wait()
            server = self._servers.get(key)
        if server is None:
            self._crashes.setdefault(key, _Crashes()).check(name)
            server = _PooledServer(name=name, config=config, max_result_bytes=max_result_bytes)
            self._servers[key] = server
            # A new process may list other tools than the one before it.
            tool_lists.invalidate(config.identity(name))
            asyncio.get_running_loop().create_task(
                self._hold(key, server, start_timeout_s, on_spawn)
            )
        await server.ready.wait()
        if server.client is None or not server.usable:
            raise MCPError(CONNECTION_CLOSED, server.failure or "the server exited")
        return server

    async def _hold(
        self,
        key: _ServerKey,
        server: _PooledServer,
        start_timeout_s: float,
        on_spawn: SpawnHook,
    ) -> None:
        log_event("mcp_pooled_server_starting", server=server.name)
        try:
            async with anyio.create_task_group() as watch:
                watch.start_soon(_abort_unless_ready, server, start_timeout_s)
                await server.run(self._pids, on_spawn)
                watch.cancel_scope.cancel()
            self._count_exit(key, server)
        finally:
            server.gone.set()

    def _count_exit(self, key: _ServerKey, server: _PooledServer) -> None:
        if self._servers.get(key) is server:
            del self._servers[key]
        tool_lists.invalidate(key[1])
        if not server.retired:
            uptime_s = time.monotonic() - server.started_at
            self._crashes.setdefault(key, _Crashes()).record(uptime_s)
            log_event(
                "mcp_pooled_server_exited",
                "warning",
                server=server.name,
                uptime_s=round(uptime_s, 1),
                reason=server.failure or "the server process exited",
            )

    async def _stop_all(self) -> None:
        servers = list(self._servers.values())
        for server in servers:
            server.retired = True
            server.abort_start("the pool closed")
            server.stop.set()
        # Each server's own stop is bounded (stdin closed, then its group killed).
        with anyio.move_on_after(_CLOSE_TIMEOUT_S - 1):
            for server in servers:
                await server.gone.wait()


async def _abort_unless_ready(server: _PooledServer, timeout_s: float) -> None:
    with anyio.move_on_after(timeout_s):
        await server.ready.wait()
        return
    server.abort_start(f"did not answer initialize within {timeout_s:g} s")


_pool = StdioPool()


def stdio_pool() -> StdioPool:
    """This process's pool of stdio servers (a forked child gets a fresh, empty one)."""
    return _pool


def close_stdio_pool() -> None:
    """Stop this process's pooled stdio servers: at worker shutdown, or after a forked job."""
    _pool.close()


def _fresh_pool_in_child() -> None:
    # The parent's loop thread does not exist in the child, and its servers are the parent's.
    global _pool
    _pool = StdioPool()


os.register_at_fork(after_in_child=_fresh_pool_in_child)
