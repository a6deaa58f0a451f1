"""Several tasks in flight in one worker process (WORKER_CONCURRENCY): they overlap, each
completes exactly once under its own rq execution, heartbeats keep every one alive, and a
warm stop, a cold stop or a SIGKILL of the worker settles each of them exactly once."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest
from rq.registry import StartedJobRegistry

from tests.chaos.crash_family import (
    assert_everything_happened_once,
    side_effect_then_slow,
    wait_for_side_effect,
)
from tests.chaos.harness import HEARTBEAT_GRACE_S, ChaosStack, WorkerProcess
from tests.support.workers import wait_until
from worker.enqueue import DEFAULT_QUEUE

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

CONCURRENCY = "4"


def started_executions(chaos: ChaosStack) -> dict[str, list[str]]:
    """rq's started registry: the execution ids of each running job."""
    with contextlib.closing(chaos.connection()) as connection:
        registry = StartedJobRegistry(DEFAULT_QUEUE, connection=connection)
        pairs = registry.get_job_and_execution_ids(cleanup=False)
    executions: dict[str, list[str]] = {}
    for job_id, execution_id in pairs:
        executions.setdefault(job_id, []).append(execution_id)
    return executions


def execution_expiries(chaos: ChaosStack) -> list[float]:
    """When each execution in rq's started registry expires without another heartbeat."""
    with contextlib.closing(chaos.connection()) as connection:
        registry = StartedJobRegistry(DEFAULT_QUEUE, connection=connection)
        return [score for _, score in connection.zrange(registry.key, 0, -1, withscores=True)]


def events_of(worker: WorkerProcess, name: str, task_id: str) -> list[dict[str, Any]]:
    return [e for e in worker.events(name) if e.get("task", e.get("task_id")) == task_id]


def all_in_flight(chaos: ChaosStack, task_ids: list[str]) -> bool:
    return all(chaos.lease_holder_pid(task_id) for task_id in task_ids)


def test_tasks_overlap_in_one_worker_process_and_each_completes_once(chaos: ChaosStack) -> None:
    worker = chaos.start_worker(WORKER_CONCURRENCY=CONCURRENCY)
    tasks = [
        chaos.notification(f"side-{n}", [{"text": f"Answer {n}", "delay_s": 8}]) for n in range(4)
    ]

    wait_until(lambda: all_in_flight(chaos, tasks), 60, "four tasks in flight")
    # All four run in the worker's own process, each under its own rq execution.
    assert {chaos.lease_holder_pid(task_id) for task_id in tasks} == {worker.pid}
    executions = started_executions(chaos)
    assert sorted(executions) == sorted(tasks)
    assert all(len(ids) == 1 for ids in executions.values())
    assert len({ids[0] for ids in executions.values()}) == 4

    for task_id in tasks:
        assert chaos.wait_for_status(task_id, timeout_s=90) == "finished"
    started = [events_of(worker, "task_started", task_id) for task_id in tasks]
    completed = [events_of(worker, "task_completed", task_id) for task_id in tasks]
    assert all(len(events) == 1 for events in started + completed)
    # Side by side: every task started before the first one completed.
    assert max(e[0]["ts"] for e in started) < min(e[0]["ts"] for e in completed)
    for n, task_id in enumerate(tasks):
        post_id = chaos.job(task_id).args[0]["post_id"]
        assert [r["content"] for r in chaos.replies_to(post_id)] == [f"Answer {n}"]
        assert len(chaos.consumption_of(task_id)) == 1
    assert started_executions(chaos) == {}
    assert worker.alive()


def test_heartbeats_keep_every_task_in_flight_alive(chaos: ChaosStack) -> None:
    worker = chaos.start_worker("--job-monitoring-interval", "1", WORKER_CONCURRENCY=CONCURRENCY)
    # The model answers late enough that all three are still in flight, however slow the
    # machine is to start the last one.
    tasks = [chaos.notification(f"beat-{n}", [{"text": "Done", "delay_s": 15}]) for n in range(3)]
    wait_until(lambda: all_in_flight(chaos, tasks), 60, "three tasks in flight")

    first = execution_heartbeats(chaos, tasks)

    # Each execution's own heartbeat moves on while its task waits for the model.
    def every_beat_moved_on() -> bool:
        later = execution_heartbeats(chaos, tasks)
        return all(later[task_id] > first[task_id] for task_id in tasks)

    wait_until(every_beat_moved_on, 10, "every execution's heartbeat to move on")
    for task_id in tasks:
        assert chaos.wait_for_status(task_id, timeout_s=90) == "finished"
    assert worker.events("heartbeat_failed") == []


def execution_heartbeats(chaos: ChaosStack, task_ids: list[str]) -> dict[str, float]:
    """The last heartbeat rq recorded for the one execution of each task."""
    executions = started_executions(chaos)
    beats: dict[str, float] = {}
    with contextlib.closing(chaos.connection()) as connection:
        for task_id in task_ids:
            (execution_id,) = executions[task_id]
            raw = connection.hget(f"rq:execution:{task_id}:{execution_id}", "last_heartbeat")
            beats[task_id] = float(raw or 0)
    return beats


def assert_stopped_warm_while_tasks_ran(
    chaos: ChaosStack, worker: WorkerProcess, tasks: list[str]
) -> None:
    """The worker asked for a warm shutdown before any task completed, then let each one
    finish once and exited cleanly."""
    assert worker.wait_exit(90) == 0
    (asked,) = [e for e in worker.events("rq_log") if "warm shut down" in e["message"]]
    for task_id in tasks:
        (completed,) = events_of(worker, "task_completed", task_id)
        assert asked["ts"] < completed["ts"]  # the signal was acted on mid-task
        assert chaos.status(task_id) == "finished"
        assert len(chaos.consumption_of(task_id)) == 1


def test_warm_shutdown_lets_every_task_in_flight_finish(chaos: ChaosStack) -> None:
    worker = chaos.start_worker(WORKER_CONCURRENCY=CONCURRENCY)
    tasks = [chaos.notification(f"warm-{n}", [{"text": "Done", "delay_s": 5}]) for n in range(3)]
    wait_until(lambda: all_in_flight(chaos, tasks), 60, "three tasks in flight")

    worker.send(signal.SIGTERM)

    assert_stopped_warm_while_tasks_ran(chaos, worker, tasks)


def test_a_sigterm_the_kernel_hands_to_a_job_thread_stops_the_worker_warm_at_once(
    chaos: ChaosStack,
) -> None:
    # Python runs signal handlers in the main thread only, and a signal taken by another
    # thread does not interrupt the main thread's blocking look at the queue (60 s).
    worker = chaos.start_worker(WORKER_CONCURRENCY=CONCURRENCY)
    tasks = [chaos.notification(f"thread-{n}", [{"text": "Done", "delay_s": 20}]) for n in range(2)]
    wait_until(lambda: all_in_flight(chaos, tasks), 60, "two tasks in flight")

    worker.send_to_a_thread(signal.SIGTERM)

    assert_stopped_warm_while_tasks_ran(chaos, worker, tasks)


def test_an_idle_limit_counts_from_the_last_job_taken_and_lets_the_run_in_flight_finish(
    chaos: ChaosStack,
) -> None:
    # rq's --max-idle-time: the main thread looks at the queue in slices while a run is in
    # flight, but the idle time still runs from the look's start.
    task_id = chaos.notification("idle", [{"text": "Done", "delay_s": 10}])
    worker = chaos.start_worker("--max-idle-time", "2", WORKER_CONCURRENCY=CONCURRENCY)

    assert worker.wait_exit(90) == 0
    (quitting,) = [e for e in worker.events("rq_log") if "idle for 2 seconds" in e["message"]]
    (completed,) = events_of(worker, "task_completed", task_id)
    assert quitting["ts"] < completed["ts"]
    assert chaos.status(task_id) == "finished"


def test_cold_shutdown_hands_every_task_back_and_each_resumes_once(chaos: ChaosStack) -> None:
    stopping = chaos.start_worker(WORKER_CONCURRENCY=CONCURRENCY)
    markers = [f"cold-{n}" for n in range(2)]
    tasks = [chaos.notification(m, side_effect_then_slow(m)) for m in markers]
    for marker, task_id in zip(markers, tasks, strict=True):
        wait_for_side_effect(chaos, marker)
        chaos.wait_for_model_requests(task_id, 2)
    replacement = chaos.start_worker(WORKER_CONCURRENCY=CONCURRENCY)

    stopping.send(signal.SIGTERM)
    time.sleep(1.5)  # rq ignores a second signal within 1 s of the first
    stopping.send(signal.SIGTERM)

    stopping.wait_exit(60)
    handed_back = {e["task_id"] for e in stopping.events("task_handed_back")}
    assert handed_back == set(tasks)
    for marker, task_id in zip(markers, tasks, strict=True):
        assert_everything_happened_once(chaos, task_id, marker)
        assert len(events_of(replacement, "task_completed", task_id)) == 1
    assert stopping.events("task_completed") == []


def test_a_killed_worker_reruns_each_task_in_flight_once_from_its_checkpoint(
    chaos: ChaosStack,
) -> None:
    # Heartbeats every 5 s: each execution expires HEARTBEAT_GRACE_S after the next was due.
    doomed = chaos.start_worker(
        "--job-monitoring-interval",
        "5",
        WORKER_CONCURRENCY=CONCURRENCY,
        HEARTBEAT_GRACE_S=str(HEARTBEAT_GRACE_S),
    )
    markers = [f"sigkill-{n}" for n in range(3)]
    tasks = [chaos.notification(m, side_effect_then_slow(m)) for m in markers]
    for marker, task_id in zip(markers, tasks, strict=True):
        wait_for_side_effect(chaos, marker)
        chaos.wait_for_model_requests(task_id, 2)
    assert {chaos.lease_holder_pid(task_id) for task_id in tasks} == {doomed.pid}
    # rq keeps each execution this long past now: the interval plus HEARTBEAT_GRACE_S, not 60 s.
    expiries = execution_expiries(chaos)
    assert len(expiries) == 3
    assert max(expiries) <= time.time() + 5 + HEARTBEAT_GRACE_S + 1
    # Started only now, so that the doomed worker holds all three.
    survivor = chaos.start_worker("--maintenance-interval", "2", WORKER_CONCURRENCY=CONCURRENCY)

    os.kill(doomed.pid, signal.SIGKILL)

    # Each execution expires on its own; rq's maintenance re-runs each task once, and the
    # re-run takes over the lease the dead run could not release.
    for marker, task_id in zip(markers, tasks, strict=True):
        assert_everything_happened_once(chaos, task_id, marker, timeout_s=150)
        assert len(events_of(survivor, "task_lease_taken_over", task_id)) == 1
        assert len(events_of(survivor, "task_started", task_id)) == 1
        assert len(events_of(survivor, "task_completed", task_id)) == 1
        assert len(chaos.llm.requests(task_id)) == 3
    assert doomed.events("task_completed") == []


def test_tasks_in_one_worker_process_share_its_connections_to_the_model(
    chaos: ChaosStack,
) -> None:
    # Each task once opened its own connection (an event loop per task); the process's
    # loop keeps one pool, so eight tasks, four at a time, reuse at most four connections.
    worker = chaos.start_worker(WORKER_CONCURRENCY=CONCURRENCY)
    tasks = [
        chaos.notification(f"pooled-{n}", [{"text": f"Answer {n}", "delay_s": 1}]) for n in range(8)
    ]
    for task_id in tasks:
        assert chaos.wait_for_status(task_id, timeout_s=90) == "finished"
    ports = {r["client_port"] for task_id in tasks for r in chaos.llm.requests(task_id)}
    assert None not in ports
    assert 1 <= len(ports) <= int(CONCURRENCY)
    for n, task_id in enumerate(tasks):
        post_id = chaos.job(task_id).args[0]["post_id"]
        assert [r["content"] for r in chaos.replies_to(post_id)] == [f"Answer {n}"]
    assert worker.alive()
