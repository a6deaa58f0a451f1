"""``agent-worker pool``: a host's preloaded, supervised pool of concurrent workers (docs/pool.md).

``Pool`` is the supervisor (``_supervisor``), ``run_member`` what each forked worker
runs (``_member``), ``hand_back_jobs_of`` how a dead worker's jobs go back to the
queue at once (``_hand_back``), ``main`` the command line (``_cli``, which
``agent-worker pool`` runs). Nothing outside the package imports them.
"""
