"""A stopping worker and rq's command listener (stop-job, shutdown), on a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.support.workers import wait_until
from worker import AgentWorker

pytestmark = pytest.mark.integration


def test_a_stopping_worker_does_not_wait_for_rq_s_command_listener(
    redis_conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rq unsubscribes, then tells the listener thread to stop and joins it for up to 1 s.
    When the unsubscribe's reply reaches the thread first (forced here, a race otherwise),
    the thread goes back to waiting, for 60 s, and the worker waits out rq's whole second."""
    worker = AgentWorker(["agents"], connection=redis_conn)
    worker.subscribe()
    pubsub = worker.pubsub
    wait_until(lambda: pubsub.subscribed, 10, "the listener to subscribe")
    send_unsubscribe = pubsub.unsubscribe

    def unsubscribe_and_let_the_listener_read_the_reply(*channels: Any) -> None:
        send_unsubscribe(*channels)
        wait_until(lambda: not pubsub.subscribed, 10, "the listener to read the reply")

    monkeypatch.setattr(pubsub, "unsubscribe", unsubscribe_and_let_the_listener_read_the_reply)

    worker.unsubscribe()

    assert not worker.pubsub_thread.is_alive()
