"""``agent-worker pool``: a host's preloaded, supervised pool of concurrent workers (docs/pool.md).

``Pool`` is the supervisor (``_supervisor``), ``run_member`` what each forked worker
runs (``_member``), ``hand_back_jobs_of`` how a dead worker's jobs go back to the
queue at once (``_hand_back``), ``main`` the command line (``_cli``).
"""

from __future__ import annotations

from worker.daemon.pool._cli import main as main
from worker.daemon.pool._hand_back import hand_back_jobs_of as hand_back_jobs_of
from worker.daemon.pool._supervisor import Pool as Pool
