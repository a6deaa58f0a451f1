"""Whether this process is an rq job process: one forked to run a single job, then ``_exit``.

rq's ``fork_work_horse`` forks the job process from the worker and makes it lead a process
group of its own (``os.setpgrp``), so that it can kill it with its children. A process
forked after this module loaded that leads its own group is such a job process. The
workers ``rq worker-pool`` forks from its parent are forks too, but stay in the pool's
group: each lives for many jobs, as a worker started by ``rq worker`` does. The package
face imports this module first thing, so the loader's id is the parent's.
"""

from __future__ import annotations

import os

_LOADED_IN_PID = os.getpid()


def in_job_process() -> bool:
    """True in an rq job process: forked after the tools loaded, leading its own group."""
    pid = os.getpid()
    return pid != _LOADED_IN_PID and os.getpgrp() == pid
