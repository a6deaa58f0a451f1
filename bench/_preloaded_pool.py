"""``python -m bench._preloaded_pool QUEUE -n N ...``: ``rq worker-pool`` from a preloaded parent.

rq's pool forks its workers from a parent that has imported only rq and the
worker class; each AgentWorker then imports the job modules and parses the
configuration itself. This parent does both first and freezes what it holds
(``gc.freeze``: the collector then leaves those objects, and their pages,
alone), so the forked workers share one copy of it, as far as copy-on-write allows.
"""

from __future__ import annotations

import gc
import importlib
import sys

from rq.cli.cli import main as rq_main

from worker import AgentWorker
from worker.models import PROVIDERS
from worker.pipeline import preload


def main() -> None:
    for function in sorted(AgentWorker.allowed_functions):
        importlib.import_module(function.rpartition(".")[0])
    preload(PROVIDERS)
    gc.freeze()
    sys.argv = ["rq", "worker-pool", *sys.argv[1:]]
    rq_main()


if __name__ == "__main__":
    main()
