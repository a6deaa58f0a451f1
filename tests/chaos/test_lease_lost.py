"""A copy of a task that finds its lease held by another copy stops at its next step
boundary, settles nothing (no reply, no consumption, no report) and leaves the rq job to
the copy holding the lease; its worker goes on serving."""

from __future__ import annotations

import contextlib

import pytest
from rq.queue import Queue
from rq.serializers import JSONSerializer

from tests.chaos.harness import ChaosStack
from tests.support.workers import QUEUE, wait_until
from worker.redis_io import keys as redis_keys

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

OTHER_COPY = "another-host:4242"


def test_a_task_whose_lease_another_copy_took_stops_at_its_next_step(chaos: ChaosStack) -> None:
    worker = chaos.start_worker()
    search = {"name": "hub__search_posts", "arguments": {"query": "leases"}}
    task_id = chaos.notification(
        "lease-lost", [{"tool_calls": [search], "delay_s": 4}, {"text": "never asked for"}]
    )
    wait_until(lambda: chaos.llm.requests(task_id), 60, "the first model request")
    with contextlib.closing(chaos.connection()) as connection:
        # What a second copy that took over the task would have done.
        connection.set(redis_keys.task_lease(task_id), OTHER_COPY, px=120_000)

    (lost,) = [worker.wait_for_event("task_lease_lost", timeout_s=60)]
    assert lost["task_id"] == task_id and OTHER_COPY in lost["reason"]
    good_id = chaos.notification("after-lease", [{"text": "Still serving"}])
    assert chaos.wait_for_status(good_id, timeout_s=90) == "finished"

    # It stopped at the step boundary after its tool call: the model was not asked again.
    assert len(chaos.llm.requests(task_id)) == 1
    assert [e["tool"] for e in worker.events("tool_call") if e["task"] == task_id] == [
        "hub__search_posts"
    ]
    # Nothing settled: the copy holding the lease owns the reply, the report and the job.
    assert [e for e in worker.events("task_completed") if e["task"] == task_id] == []
    post_id = chaos.job(task_id).args[0]["post_id"]
    assert chaos.replies_to(post_id) == []
    assert chaos.consumption_of(task_id) == []
    assert "report" not in chaos.job(task_id).meta
    assert chaos.status(task_id) == "started"
    with contextlib.closing(chaos.connection()) as connection:
        queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)
        assert task_id not in queue.started_job_registry.get_job_ids()  # never "abandoned"
        assert connection.get(redis_keys.task_lease(task_id)) == OTHER_COPY.encode()
    assert worker.alive()
