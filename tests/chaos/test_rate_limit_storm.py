"""A provider answering 429 to the whole fleet: tasks wait or are requeued, none fails, and
the fleet never sends more than its shared limit allows."""

from __future__ import annotations

import pytest

from tests.chaos.harness import ChaosStack

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

WORKERS = 4
TASKS = 8
REQUESTS_PER_MINUTE = 20
STORM_S = 20
# Requests a provider may see beyond the bucket: the limiter's reads and writes are not one
# transaction with the HTTP request, so two workers can pass at nearly the same moment.
SLACK = 2


def overdraft(arrivals: list[float], per_minute: int) -> float:
    """Replay request arrivals through the provider's view of the limit: a bucket of
    ``per_minute`` requests, refilled at ``per_minute`` per minute, full at the start.
    Returns the deepest it was overdrawn (0 when the limit was respected)."""
    tokens, last, deepest = float(per_minute), None, 0.0
    for at in sorted(arrivals):
        if last is not None:
            tokens = min(per_minute, tokens + (at - last) * per_minute / 60)
        tokens -= 1
        last = at
        deepest = max(deepest, -tokens)
    return deepest


def test_overdraft_is_zero_within_the_limit_and_counts_a_burst() -> None:
    assert overdraft([0.0] * 20, 20) == 0
    assert overdraft([0.0] * 23, 20) == 3
    assert overdraft([float(3 * n) for n in range(100)], 20) == 0


def test_429_storm_requeues_tasks_but_fails_none_and_respects_the_fleet_limit(
    chaos: ChaosStack,
) -> None:
    chaos.start_workers(
        WORKERS,
        LLM_REQUESTS_PER_MINUTE=str(REQUESTS_PER_MINUTE),
        REQUEUE_DELAY_S="2",
    )
    chaos.llm.storm(429, seconds=STORM_S, retry_after_s=1)
    task_ids = [
        chaos.notification("storm", [{"text": f"Answer {number}"}]) for number in range(TASKS)
    ]

    reports = {task_id: chaos.wait_for_outcome(task_id, timeout_s=240) for task_id in task_ids}

    assert {r["outcome"] for r in reports.values()} == {"completed"}, reports
    assert {chaos.status(task_id) for task_id in task_ids} == {"finished"}
    for task_id in task_ids:
        post_id = chaos.job(task_id).args[0]["post_id"]
        assert len(chaos.replies_to(post_id)) == 1
        assert len(chaos.consumption_of(task_id)) == 1
        assert chaos.error_posts_about(task_id) == []
    stats = chaos.llm.stats()
    assert stats["storm_answers"] > 0
    arrivals = [r["received_at"] for r in chaos.llm.requests()]
    assert overdraft(arrivals, REQUESTS_PER_MINUTE) <= SLACK, sorted(arrivals)
