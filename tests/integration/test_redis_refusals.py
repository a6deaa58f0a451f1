"""A Redis that refuses writes is an outage the worker rides out, as it rides out a restart.

A real redis-server is filled up to ``maxmemory`` under ``noeviction`` (every write
answers OOM) or turned into a replica of a server that does not exist (every write
answers READONLY), idle and in the middle of a task. A real ``rq worker`` survives,
and the task completes once Redis accepts writes again, with exactly one reply and
one consumption record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError

from tests.chaos.harness import ChaosStack, WorkerProcess, scrape_metric
from tests.support.redis_server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FILLER = "refusal-test-filler:"
# Long enough that the job process meets the refusal mid-task (its model answers after
# MODEL_DELAY_S); well inside the ~33 s every process of the worker waits for Redis.
MODEL_DELAY_S = 3
REFUSAL_S = 8


@pytest.fixture
def stack(chaos: ChaosStack) -> Iterator[ChaosStack]:
    """The shared chaos stack (tests/integration/conftest.py), writable again after the test."""
    yield chaos
    with contextlib.closing(chaos.connection()) as connection:
        accept_writes(connection)


def fill_to_oom(connection: redis.Redis) -> None:
    """``maxmemory 1mb`` under ``noeviction``, filled until writes answer OOM."""
    connection.config_set("maxmemory-policy", "noeviction")
    connection.config_set("maxmemory", "1mb")
    for index in range(10_000):
        try:
            connection.set(f"{FILLER}{index}", b"x" * 65_536)
        except OutOfMemoryError:
            return
    raise AssertionError("Redis never refused a write under maxmemory 1mb")


def accept_writes(connection: redis.Redis) -> None:
    """Back to a writable primary with room to spare."""
    connection.execute_command("REPLICAOF", "NO", "ONE")
    connection.config_set("maxmemory", "0")
    fillers = list(connection.scan_iter(f"{FILLER}*", count=1000))
    if fillers:
        connection.delete(*fillers)


def become_replica_of_nothing(connection: redis.Redis) -> None:
    """A failover gone wrong: the server follows a primary that does not exist (READONLY)."""
    connection.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))


def refusals_answered(connection: redis.Redis) -> int:
    """OOM and READONLY errors Redis has answered so far (INFO errorstats)."""
    stats = connection.info("errorstats")
    return sum(
        int(value["count"]) if isinstance(value, dict) else 0
        for name, value in stats.items()
        if name in ("errorstat_OOM", "errorstat_READONLY")
    )


def assert_answered_once(stack: ChaosStack, worker: WorkerProcess, task_id: str) -> None:
    report = stack.wait_for_outcome(task_id, timeout_s=150)
    assert report["outcome"] == "completed", report
    post_id = stack.job(task_id).args[0]["post_id"]
    assert [reply["content"] for reply in stack.replies_to(post_id)] == ["Answered after it"]
    assert len(stack.consumption_of(task_id)) == 1
    completed = [e for e in worker.events("task_completed") if e["task"] == task_id]
    assert len(completed) == 1
    assert worker.alive()


@pytest.mark.parametrize(
    ("refuse", "refusal"),
    [(fill_to_oom, OutOfMemoryError), (become_replica_of_nothing, ReadOnlyError)],
    ids=["oom", "readonly"],
)
def test_writes_refused_mid_task_are_waited_out(
    stack: ChaosStack, refuse: object, refusal: type[Exception]
) -> None:
    worker = stack.start_worker()
    task_id = stack.notification(
        "refused", [{"text": "Answered after it", "delay_s": MODEL_DELAY_S}]
    )
    stack.wait_for_model_requests(task_id, 1)

    with contextlib.closing(stack.connection()) as connection:
        assert callable(refuse)
        refuse(connection)
        with pytest.raises(refusal):
            connection.set("refusal-test-probe", "x")
        refused_before = refusals_answered(connection)
        # The model answers meanwhile: the job's checkpoint, the worker's heartbeats and
        # its bookkeeping all meet the refusal.
        time.sleep(REFUSAL_S)
        assert refusals_answered(connection) > refused_before  # the worker met it
        accept_writes(connection)

    assert_answered_once(stack, worker, task_id)
    assert worker.events("task_failed") == []


def test_an_idle_worker_waits_out_a_full_redis_then_serves(stack: ChaosStack) -> None:
    metrics_port = free_port()
    # The idle worker's first refused write gives up after 3 s (REDIS_PATIENCE_S), not 33 s.
    worker = stack.start_worker(METRICS_PORT=str(metrics_port), REDIS_PATIENCE_S="3")

    with contextlib.closing(stack.connection()) as connection:
        fill_to_oom(connection)
        # rq's own loop quits on a refused BLMOVE ("unhandled exception, quitting").
        event = worker.wait_for_event(
            "redis_unavailable", timeout_s=120, where=lambda e: e.get("kind") == "oom"
        )
        assert worker.alive(), worker.stderr[-3000:]
        accept_writes(connection)

    assert event["during"]
    waits = scrape_metric(metrics_port, 'agent_redis_unavailable_total{kind="oom"}')
    assert waits is not None and waits >= 1
    task_id = stack.notification("after-oom", [{"text": "Answered after it"}])
    assert_answered_once(stack, worker, task_id)
