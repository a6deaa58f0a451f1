"""Job hashes rq cannot even load, failed in the worker instead of ending it (traps 4, 15).

rq loads a dequeued job before any of our vetting: a hash it cannot load (garbage,
over JOB_DATA_MAX_BYTES) raises inside rq's dequeue and the worker would quit
("unhandled exception, quitting"). Here such a job fails visibly (log event, metric,
a clear reason in the failed registry), and a Redis refusal during the dequeue is
waited out.
"""

from __future__ import annotations

import time

from rq.defaults import DEFAULT_FAILURE_TTL
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry
from rq.utils import current_timestamp, now, utcformat

from worker.daemon._outages import OutageTolerantWorker
from worker.logs import log_event
from worker.metrics import worker_metrics
from worker.redis_io import is_redis_outage


class UnloadableJobsWorker(OutageTolerantWorker):
    """The outage-tolerant worker, failing job hashes rq cannot load instead of quitting."""

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        wait_s = 1.0
        while True:
            try:
                result: tuple[Job, Queue] | None = super().dequeue_job_and_maintain_ttl(
                    timeout, max_idle_time
                )
                return result
            except Exception as exc:
                if is_redis_outage(exc):
                    # rq's own loop rides out only a lost connection; a refused BLMOVE (OOM,
                    # READONLY) would end the worker ("unhandled exception, quitting").
                    self._note_outage("dequeue", exc, retry_in_s=wait_s)
                    time.sleep(wait_s)
                    wait_s = min(
                        wait_s * self.exponential_backoff_factor, self.max_connection_wait_time
                    )
                    continue
                # rq tags a job hash it cannot even load with its id and queue; without
                # this the parent would quit on one garbage hash (trap 4).
                job_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if not isinstance(job_id, str) or not isinstance(queue, Queue):
                    raise
                self._fail_unloadable(job_id, queue, exc)

    def _fail_unloadable(self, job_id: str, queue: Queue, exc: Exception) -> None:
        reason = f"job hash cannot be loaded by rq: {type(exc).__name__}: {exc}"
        log_event("job_undecodable", level="error", job_id=job_id, queue=queue.name, reason=reason)
        worker_metrics().job_undecodable()
        failed_registry = FailedJobRegistry(queue=queue)

        def record_failure() -> None:
            with self.connection.pipeline(transaction=True) as pipe:
                pipe.hset(
                    Job.key_for(job_id),
                    mapping={
                        "status": JobStatus.FAILED.value,
                        "exc_info": reason,
                        "ended_at": utcformat(now()),
                    },
                )
                pipe.zadd(failed_registry.key, {job_id: current_timestamp() + DEFAULT_FAILURE_TTL})
                pipe.lrem(queue.intermediate_queue_key, 1, job_id)
                pipe.execute()

        self._until_redis_answers("fail_job", record_failure)

    def _drop_from_intermediate(self, queue: Queue, job_id: str) -> None:
        # rq's job process removes it when the job starts; a job that never starts must too.
        self.connection.lrem(queue.intermediate_queue_key, 1, job_id)
