"""A call's timeout: ``anyio.fail_after``'s behaviour, for less of a step's CPU.

``anyio.fail_after`` wraps its cancel scope in two generator context managers; the loop
enters two timeouts per step, so those layers were a sizeable share of a step's own CPU.
This is the same cancel scope entered directly: the block is cancelled when the deadline
passes, and ``TimeoutError`` is raised then (and only then), as ``fail_after`` does.
"""

from __future__ import annotations

from types import TracebackType

import anyio


class call_timeout:  # lowercase: used like `contextlib.suppress`, as `with call_timeout(s):`
    """``with call_timeout(seconds):`` cancels the block after ``seconds`` and raises
    TimeoutError; a cancellation from an enclosing scope passes through unchanged."""

    __slots__ = ("_scope",)

    def __init__(self, delay_s: float) -> None:
        self._scope = anyio.CancelScope(deadline=anyio.current_time() + delay_s)

    def __enter__(self) -> None:
        # The scope is not handed out: only its deadline can cancel it, so a caught
        # cancellation is always the timeout.
        self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        scope = self._scope
        if scope.__exit__(exc_type, exc, traceback) or scope.cancelled_caught:
            raise TimeoutError from None
