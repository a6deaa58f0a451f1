"""The worker daemon: ``AgentWorker`` (what ``rq worker agents`` runs) and its parts.

``AgentWorker`` vets each job before it runs and settles it after; the job runs in
rq's forked job process, or in a thread of the worker process with WORKER_CONCURRENCY
above 1.
"""

from __future__ import annotations

from worker.daemon._worker import AgentWorker as AgentWorker
