"""The jobs of a pool worker that died, handed back at once through rq's abandoned-job handling.

rq recovers a dead worker's jobs only once each execution's heartbeat has expired (the
job monitoring interval plus HEARTBEAT_GRACE_S) and a worker's maintenance has cleaned
the started registry: a minute or two. The pool reaped the dead worker (``waitpid``), so
no run of it is left, and rq's own records name its runs:

    for each execution in the dead worker's index (rq: Worker.get_current_executions)
        kill the process groups the run recorded (CLI sandboxes, stdio servers)
        free the task lease the run held (``host:pid/execution``)
        expire it in its queue's started registry: score 0, "its heartbeat is long gone"
    per queue, rq's StartedJobRegistry.cleanup up to score 0: rq's abandoned-job handling
        for exactly those runs (retried while retries_left, else failed; callbacks as rq's)
    rq's register_death for the worker (off the worker registry, index deleted)

Nothing runs twice: the process is gone, and a re-run takes the lease the dead run freed.
"""

from __future__ import annotations

from collections import defaultdict

from redis import Redis
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from worker.coordination import release_lease_of
from worker.daemon import AgentWorker
from worker.logs import log_event
from worker.redis_io import CappedJob, kill_recorded_process_groups

# The score a run's entry gets in the started registry: every real expiry is later.
_LONG_EXPIRED = 0


def hand_back_jobs_of(
    worker_class: type[AgentWorker], connection: Redis, worker_name: str, pid: int
) -> list[str]:
    """Hand back every job the dead worker ``worker_name`` (process ``pid``) was running;
    returns their ids."""
    dead = worker_class([], name=worker_name, connection=connection)
    executions = dead.get_current_executions(refresh=True)
    runs_by_queue: dict[str, list[str]] = defaultdict(list)
    for execution in executions:
        origin = connection.hget(CappedJob.key_for(execution.job_id), "origin")
        if origin is None:
            continue  # the job itself is gone
        kill_recorded_process_groups(connection, execution.job_id, execution.id)
        release_lease_of(connection, execution.job_id, pid, execution.id)
        queue_name = origin.decode() if isinstance(origin, bytes) else str(origin)
        runs_by_queue[queue_name].append(execution.composite_key)
    handed_back = []
    for queue_name, runs in runs_by_queue.items():
        registry = StartedJobRegistry(
            queue_name, connection=connection, job_class=CappedJob, serializer=JSONSerializer
        )
        connection.zadd(registry.key, dict.fromkeys(runs, _LONG_EXPIRED), xx=True)
        registry.cleanup(timestamp=_LONG_EXPIRED)
        handed_back += [run.partition(":")[0] for run in runs]
    dead.register_death()  # type: ignore[no-untyped-call]
    if handed_back:
        log_event(
            "dead_worker_jobs_handed_back",
            level="warning",
            worker=worker_name,
            pid=pid,
            task_ids=handed_back,
        )
    return handed_back
