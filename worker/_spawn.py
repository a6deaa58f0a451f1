"""The hook told of every child process a task starts, so that a hard crash orphans none.

Executors, the MCP toolbox and the tool pool call ``on_spawn(pid)`` with the pid (the
process group) of each process they start. Under rq the pipeline passes the job's
child-process record (``worker.daemon``), which the worker parent kills after a crash;
everywhere else the hook is ``ignore_spawn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

SpawnHook: TypeAlias = Callable[[int], None]


def ignore_spawn(pid: int) -> None:
    """The hook where nobody records a task's children (no rq job, tests)."""
