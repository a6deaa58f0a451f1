"""Whether this process is a fork of the one that loaded ``worker.tools``: an rq job process.

The worker parent loads the tools before it forks a job process (WORKER_CONCURRENCY = 1),
so a process whose id differs from the loader's is such a job process, which lives for one
job. The package face imports this module first thing, so the loader's id is the parent's.
"""

from __future__ import annotations

import os

_LOADED_IN_PID = os.getpid()


def forked_since_tools_loaded() -> bool:
    return os.getpid() != _LOADED_IN_PID
