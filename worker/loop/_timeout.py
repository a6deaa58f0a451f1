"""A call's timeout: ``anyio.fail_after``'s behaviour, for less of a step's CPU.

``anyio.fail_after`` wraps its cancel scope in two generator context managers, and a cancel
scope with a deadline schedules (and then cancels) an event-loop timer of its own. The loop
enters two timeouts per step, nearly all of which end long before their deadline, so those
were a sizeable share of a step's own CPU.

Here each call gets an anyio cancel scope without a deadline of its own, and its deadline
goes to the event loop's ``_Deadlines``: one timer for all of them, set for the earliest,
which cancels each scope whose deadline has passed, as the scope's own timer would have.
``TimeoutError`` is raised then (and only then), as ``fail_after`` does; a cancellation from
an enclosing scope passes through unchanged. Outside asyncio the scope keeps its own deadline.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from types import TracebackType

import anyio

# Ended timeouts are left in the heap (marking one is cheaper than taking it out) until they
# are at least this many and half of it.
_COMPACT_AT = 64


class _Deadlines:
    """The deadlines of one event loop's open timeouts, behind a single timer."""

    __slots__ = (
        "__weakref__",
        "_ended",
        "_heap",
        "_loop",
        "_order",
        "_timer",
        "_timer_at",
        "scope_type",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # The backend's own class of `anyio.CancelScope()`: made directly, a scope skips
        # looking up the running async library each time.
        self.scope_type = type(anyio.CancelScope())
        # [deadline, order, scope]; the scope is None once its block ended or was cancelled.
        self._heap: list[list[object]] = []
        self._order = itertools.count()
        self._ended = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(self, deadline: float, scope: anyio.CancelScope) -> list[object]:
        entry: list[object] = [deadline, next(self._order), scope]
        heapq.heappush(self._heap, entry)
        if deadline < self._timer_at:
            self._arm(deadline)
        return entry

    def end(self, entry: list[object]) -> None:
        """The block ended: its deadline no longer counts."""
        if entry[2] is None:
            return  # already cancelled, and out of the heap
        entry[2] = None
        self._ended += 1
        if self._ended >= _COMPACT_AT and 2 * self._ended >= len(self._heap):
            self._heap = [kept for kept in self._heap if kept[2] is not None]
            heapq.heapify(self._heap)
            self._ended = 0

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._fire)
        self._timer_at = deadline

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time()
        heap = self._heap
        # The loop may run a timer up to its clock resolution early: only what is due.
        while heap and (heap[0][2] is None or heap[0][0] <= now):  # type: ignore[operator]
            entry = heapq.heappop(heap)
            scope = entry[2]
            if scope is None:
                self._ended -= 1
                continue
            entry[2] = None
            assert isinstance(scope, anyio.CancelScope)
            scope.cancel()
        if heap:
            self._arm(heap[0][0])  # type: ignore[arg-type]


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = (
    weakref.WeakKeyDictionary()
)


_last: _Deadlines | None = None  # the last loop's: most processes run one loop


def _deadlines(loop: asyncio.AbstractEventLoop) -> _Deadlines:
    global _last
    last = _last
    if last is not None and last._loop is loop:
        return last
    found = _by_loop.get(loop)
    if found is None:
        found = _by_loop[loop] = _Deadlines(loop)
    _last = found
    return found


class call_timeout:  # lowercase: used like `contextlib.suppress`, as `with call_timeout(s):`
    """``with call_timeout(seconds):`` cancels the block after ``seconds`` and raises
    TimeoutError; a cancellation from an enclosing scope passes through unchanged."""

    __slots__ = ("_delay_s", "_entry", "_scope", "_shared")

    def __init__(self, delay_s: float) -> None:
        if math.isnan(delay_s):
            raise ValueError("deadline must not be NaN")
        self._delay_s = delay_s

    def __enter__(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend: the scope's own deadline
            self._shared = None
            self._scope = anyio.CancelScope(deadline=anyio.current_time() + self._delay_s)
            self._scope.__enter__()
            return
        shared = _deadlines(loop)
        # The scope is not handed out: only its deadline can cancel it, so a caught
        # cancellation is always the timeout.
        scope = self._scope = shared.scope_type()
        scope.__enter__()
        delay_s = self._delay_s
        if delay_s <= 0 or delay_s == math.inf:
            self._shared = None
            if delay_s <= 0:
                scope.cancel()  # already past, as a scope entered after its deadline is
            return
        self._shared = shared
        self._entry = shared.add(loop.time() + delay_s, scope)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._shared is not None:
            self._shared.end(self._entry)
        scope = self._scope
        if scope.__exit__(exc_type, exc, traceback) or scope.cancelled_caught:
            raise TimeoutError from None
