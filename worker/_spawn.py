"""The processes a task lives among: the hook told of each child it starts, and whether
this process is an rq job process.

Executors, the MCP toolbox and the tool pool call ``on_spawn(pid)`` with the pid (the
process group) of each process they start. Under rq the pipeline passes the job's
child-process record (``worker.daemon``), which the worker parent kills after a crash;
everywhere else the hook is ``ignore_spawn``.

rq's ``fork_work_horse`` forks the job process from the worker and makes it lead a process
group of its own (``os.setpgrp``), so that it can kill it with its children. A process
forked after this module loaded that leads its own group is such a job process. The
workers ``rq worker-pool`` forks from its parent are forks too, but stay in the pool's
group: each lives for many jobs, as a worker started by ``rq worker`` does. The tools'
package face imports this module first thing, so the loader's id is the parent's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeAlias

_LOADED_IN_PID = os.getpid()

SpawnHook: TypeAlias = Callable[[int], None]


def ignore_spawn(pid: int) -> None:
    """The hook where nobody records a task's children (no rq job, tests)."""


def in_job_process() -> bool:
    """True in an rq job process: forked after the tools loaded, leading its own group."""
    pid = os.getpid()
    return pid != _LOADED_IN_PID and os.getpgrp() == pid
