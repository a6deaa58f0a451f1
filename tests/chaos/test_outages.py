"""The Hub and Redis go away and come back: nothing is lost, nothing is delivered twice."""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import ChaosStack, ride_out_redis_restarts, scrape_metric
from tests.support.redis_server import free_port
from tests.support.workers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

# The Hub stays down at least this long: every write and read of both tasks meets it first.
HUB_OUTAGE_S = 10


def test_replies_wait_in_the_outbox_while_the_hub_is_down_and_arrive_once(
    chaos: ChaosStack,
) -> None:
    metrics_port = free_port()
    worker = chaos.start_worker(
        "--maintenance-interval", "2", METRICS_PORT=str(metrics_port), REQUEUE_DELAY_S="3"
    )
    answering = chaos.notification("outage", [{"text": "Reply during the outage", "delay_s": 5}])
    wait_until(lambda: chaos.llm.requests(answering), 60, "the model to be asked")
    answering_post = chaos.job(answering).args[0]["post_id"]
    late = "late-" + answering
    late_post = chaos.seed_post(f"@chaos-agent one more [[scenario:{late}]]")
    chaos.llm.set_scenario(late, [{"text": "Reply after the outage"}])

    chaos.hub.stop()
    down_since = time.monotonic()
    # Enqueued while the Hub is down: it cannot even read its thread yet.
    chaos.enqueue(
        {"task_id": late, "type": "notification", "agent_id": "chaos-agent", "post_id": late_post}
    )

    assert chaos.wait_for_status(answering) == "finished"
    assert chaos.report(answering)["outcome"] == "completed"
    parked = {e["kind"] for e in worker.events("hub_write_parked") if e["task"] == answering}
    assert {"comment", "consumption"} <= parked
    assert chaos.outbox_size() >= 2
    assert scrape_metric(metrics_port, "agent_outbox_items") == chaos.outbox_size()
    requeued = worker.wait_for_event("task_requeued", where=lambda e: e["task"] == late)
    assert "Hub is unavailable" in requeued["reason"]
    time.sleep(max(0.0, HUB_OUTAGE_S - (time.monotonic() - down_since)))

    chaos.hub.start()  # same port, same state file

    # A requeued run is "finished" too, with outcome "requeued": wait for the run that ended
    # for good, then for any write of its own the restarting Hub did not take.
    assert chaos.wait_for_outcome(late, timeout_s=90)["outcome"] == "completed"
    wait_until(lambda: chaos.outbox_size() == 0, 90, "the outbox to drain")
    assert [r["content"] for r in chaos.replies_to(answering_post)] == ["Reply during the outage"]
    assert [r["content"] for r in chaos.replies_to(late_post)] == ["Reply after the outage"]
    assert len(chaos.consumption_of(answering)) == 1
    assert len(chaos.consumption_of(late)) == 1
    assert worker.events("outbox_drained")
    assert scrape_metric(metrics_port, "agent_outbox_items") == 0


def test_worker_rides_out_redis_restarts_idle_mid_task_and_while_renewing_its_lock(
    chaos: ChaosStack,
) -> None:
    worker = chaos.start_worker("--job-monitoring-interval", "1")
    ride_out_redis_restarts(chaos, worker)
