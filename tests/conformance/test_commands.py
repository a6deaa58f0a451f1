"""rq's stop-job command (``send_stop_job_command``, what dashboards call) stops exactly the
job it names, in a worker forking a job process per job or running jobs in threads."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from rq.command import send_stop_job_command
from rq.serializers import JSONSerializer

from tests.chaos.harness import ChaosStack, concurrent_workers
from tests.conformance.rq_api import start_test_worker
from tests.support.workers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def searches(count: int, *, delay_s: float) -> list[dict[str, Any]]:
    """Tool-calling turns that never repeat a call, each answered after ``delay_s``."""
    return [
        {
            "tool_calls": [{"name": "hub__search_posts", "arguments": {"query": f"topic {n}"}}],
            "delay_s": delay_s,
        }
        for n in range(count)
    ]


def test_stop_job_stops_only_the_named_task_and_the_worker_keeps_working(
    chaos: ChaosStack,
) -> None:
    worker = start_test_worker(chaos)
    neighbour = chaos.notification("neighbour", [*searches(3, delay_s=1), {"text": "Done"}])
    # Far more turns than it gets through before the command lands.
    stopped = chaos.notification("stopped", [*searches(60, delay_s=1), {"text": "Never"}])
    wait_until(lambda: chaos.llm.requests(stopped), 120, "the second task's first model call")

    with contextlib.closing(chaos.connection()) as connection:
        send_stop_job_command(connection, stopped, serializer=JSONSerializer)

    # As rq does with a job process it killed: STOPPED, and never retried.
    assert chaos.wait_for_status(stopped, ("stopped",), timeout_s=90) == "stopped"
    assert len(chaos.llm.requests(stopped)) < 60
    assert chaos.wait_for_status(neighbour, timeout_s=90) == "finished"
    assert chaos.report(neighbour)["outcome"] == "completed"
    if concurrent_workers():
        # A thread is not killed: its task was cancelled, and reported as a cancel is.
        assert chaos.report(stopped)["outcome"] == "cancelled"
        assert len(chaos.consumption_of(stopped)) == 1
    assert worker.alive()

    later = chaos.notification("later", [{"text": "Still here"}])
    assert chaos.wait_for_status(later, timeout_s=90) == "finished"
    assert chaos.status(stopped) == "stopped"
    assert worker.alive()
