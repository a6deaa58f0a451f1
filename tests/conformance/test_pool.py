"""``agent-worker pool``: its workers forked from one preloaded process, supervised through
real signals and real crashes, the jobs of a dead worker handed back at once through rq."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx2
import pytest

from tests.chaos.harness import ChaosStack, WorkerProcess, ride_out_redis_restarts
from tests.conformance.rq_api import enqueue_job, runs_of, started_scores, wait_for_runs
from tests.support.redis_server import free_port
from tests.support.workers import WORKER_CLASS, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def start_pool(stack: ChaosStack, *args: str, **env: str) -> WorkerProcess:
    """The pool of test workers (they may run tests.support.jobs), rq's defaults otherwise."""
    return stack.start_pool(*args, RQ_WORKER_CLASS=WORKER_CLASS, **env)


def worker_pids(pool: WorkerProcess) -> list[int]:
    """The workers the pool started, oldest first."""
    return [int(event["pid"]) for event in pool.events("pool_worker_started")]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])


def test_the_pool_forks_its_workers_runs_their_tasks_and_stops_warm_on_sigterm(
    chaos: ChaosStack,
) -> None:
    pool = start_pool(chaos, "--processes", "2", "--concurrency", "3")
    workers = worker_pids(pool)
    assert len(workers) == 2
    assert all(parent_of(pid) == pool.pid for pid in workers)
    jobs = [enqueue_job(chaos, "pause", meta={"pause_s": 3}) for _ in range(5)]
    for job_id in jobs:
        wait_for_runs(chaos, job_id, 1)

    pool.send(signal.SIGTERM)  # warm: every task in flight finishes first

    assert pool.wait_exit(60) == 0
    assert [chaos.status(job_id) for job_id in jobs] == ["finished"] * 5
    assert [runs_of(chaos, job_id) for job_id in jobs] == [1] * 5
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)
    assert pool.events("pool_worker_started")[2:] == []  # none was restarted


def test_a_native_crash_hands_its_neighbours_back_at_once_and_a_new_worker_takes_its_place(
    chaos: ChaosStack,
) -> None:
    pool = start_pool(chaos, "--processes", "1", "--concurrency", "4")
    neighbour = enqueue_job(chaos, "pause", retries=2, meta={"pause_s": 4})
    wait_for_runs(chaos, neighbour, 1)
    # When rq's own recovery would call the neighbour abandoned: its heartbeat expiry.
    heartbeat_expires = max(started_scores(chaos).values())
    crasher = enqueue_job(chaos, "crash_in_native_code")

    ended = pool.wait_for_event("pool_worker_ended")
    assert ended["exit_status"] == -signal.SIGABRT
    wait_for_runs(chaos, neighbour, 2)

    assert time.time() < heartbeat_expires  # re-run before any heartbeat could expire
    assert chaos.wait_for_status(neighbour, timeout_s=60) == "finished"
    assert runs_of(chaos, neighbour) == 2
    # The crashing job had no retries: failed, as rq fails an abandoned job, never re-run.
    assert chaos.wait_for_status(crasher, ("failed",), timeout_s=30) == "failed"
    assert runs_of(chaos, crasher) == 1
    assert "AbandonedJobError" in chaos.failure_reason(crasher)
    handed_back = pool.wait_for_event("dead_worker_jobs_handed_back")
    assert sorted(handed_back["task_ids"]) == sorted([neighbour, crasher])
    assert len(worker_pids(pool)) == 2 and pool.alive()


def test_a_sigkilled_worker_is_replaced_and_its_task_runs_again_from_the_queue(
    chaos: ChaosStack,
) -> None:
    pool = start_pool(chaos, "--processes", "2", "--concurrency", "2")
    job_id = enqueue_job(chaos, "pause", retries=1, meta={"pause_s": 15})
    wait_for_runs(chaos, job_id, 1)
    running_in = worker_running(chaos, pool, job_id)

    os.kill(running_in, signal.SIGKILL)  # the OOM killer's way

    wait_for_runs(chaos, job_id, 2)
    assert worker_running(chaos, pool, job_id) not in (0, running_in)
    wait_until(lambda: len(worker_pids(pool)) == 3, 30, "a new worker in the dead one's place")
    ended = pool.wait_for_event("pool_worker_ended")
    assert (ended["pid"], ended["exit_status"]) == (running_in, -signal.SIGKILL)
    with contextlib.closing(chaos.connection()) as connection:
        registered = {name.decode() for name in connection.smembers("rq:workers")}
    assert f"rq:worker:{ended['worker']}" not in registered  # rq's register_death


def worker_running(stack: ChaosStack, pool: WorkerProcess, job_id: str) -> int:
    """The pid of the pool's worker rq says runs the job (0: none of them)."""
    with contextlib.closing(stack.connection()) as connection:
        name = (connection.hget(f"rq:job:{job_id}", "worker_name") or b"").decode()
    pids = {event["worker"]: int(event["pid"]) for event in pool.events("pool_worker_started")}
    return pids.get(name, 0)


def test_a_second_sigterm_is_a_cold_shutdown_that_hands_every_task_back(
    chaos: ChaosStack,
) -> None:
    pool = start_pool(chaos, "--processes", "2", "--concurrency", "2")
    jobs = [enqueue_job(chaos, "pause", retries=1, meta={"pause_s": 60}) for _ in range(2)]
    for job_id in jobs:
        wait_for_runs(chaos, job_id, 1)

    pool.send(signal.SIGTERM)
    time.sleep(1.5)  # rq ignores a second signal within a second of the first
    pool.send(signal.SIGTERM)

    assert pool.wait_exit(60) == 0
    assert [chaos.status(job_id) for job_id in jobs] == ["queued"] * 2
    assert len(pool.events("task_handed_back")) == 2


def test_the_pool_rides_out_redis_restarts_idle_mid_task_and_while_renewing_its_lock(
    chaos: ChaosStack,
) -> None:
    pool = start_pool(chaos, "--processes", "2", "--concurrency", "4")
    ride_out_redis_restarts(chaos, pool)
    assert pool.events("pool_worker_ended") == []


def test_an_idle_pool_asked_to_stop_while_redis_is_down_stops_without_waiting_for_redis(
    chaos: ChaosStack,
) -> None:
    port = free_port()
    # Far longer than the wait below: a pool that waits for Redis cannot pass.
    pool = start_pool(
        chaos,
        "--processes",
        "2",
        "--concurrency",
        "2",
        METRICS_PORT=str(port),
        REDIS_PATIENCE_S="600",
    )
    chaos.redis_server.stop()
    # Long enough for rq's scheduler (a heartbeat every second) to meet the outage too.
    time.sleep(3)

    pool.send(signal.SIGTERM)

    assert pool.wait_exit(60) == 0
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_the_pool_serves_one_metrics_endpoint_for_the_host(chaos: ChaosStack) -> None:
    # Garbled before any worker runs: a worker taking the job first would just run it.
    undecodable = enqueue_job(chaos, "pause", meta={"pause_s": 0})
    with contextlib.closing(chaos.connection()) as connection:
        connection.hset(f"rq:job:{undecodable}", "data", b"\x00not zlib, not json")
    port = free_port()
    pool = start_pool(chaos, "--processes", "2", "--concurrency", "2", METRICS_PORT=str(port))
    url = f"http://127.0.0.1:{port}"

    def counted() -> str | None:
        text = httpx2.get(f"{url}/metrics", timeout=5).text
        return text if "agent_jobs_undecodable_total 1.0" in text else None

    # Two workers fork and start first: past 30 s under the full suite's load.
    text = wait_until(counted, 90, "the undecodable job counted on the pool's /metrics")
    assert 'agent_pool_workers{state="running"} 2.0' in text
    assert 'agent_pool_workers{state="configured"} 2.0' in text
    assert httpx2.get(f"{url}/healthz", timeout=5).status_code == 200
    assert all(event["metrics_port"] is None for event in pool.events("worker_started"))


def test_a_burst_pool_empties_the_queue_and_exits(chaos: ChaosStack) -> None:
    jobs = [enqueue_job(chaos, "pause", meta={"pause_s": 1}) for _ in range(4)]

    pool = start_pool(chaos, "--processes", "2", "--concurrency", "2", "--burst")

    assert pool.wait_exit(90) == 0
    assert [chaos.status(job_id) for job_id in jobs] == ["finished"] * 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--concurrency", "1"), "--concurrency must be at least 2"),
        (("--worker-class", "rq.Worker"), "is not an AgentWorker subclass"),
        (("--worker-class", "no.such.Class"), "worker class 'no.such.Class'"),
    ],
)
def test_the_pool_refuses_what_it_cannot_run_with_one_line(
    chaos: ChaosStack, args: tuple[str, ...], message: str
) -> None:
    pool = chaos.start_pool("--burst", *args)
    assert pool.wait_exit(60) == 2
    assert message in pool.stderr


def test_a_pool_whose_configuration_fails_the_checks_stops_before_forking(
    chaos: ChaosStack,
) -> None:
    pool = chaos.start_pool("--burst", MCP_CONFIG=str(chaos.workdir / "no-such-mcp.yaml"))

    assert pool.wait_exit(60) == 2
    assert "MCP_CONFIG" in pool.stderr
    assert pool.events("pool_worker_started") == []


def test_workers_of_a_killed_pool_finish_their_tasks_warm_and_exit(chaos: ChaosStack) -> None:
    pool = start_pool(chaos, "--processes", "1", "--concurrency", "2")
    (worker,) = worker_pids(pool)
    job_id = enqueue_job(chaos, "pause", meta={"pause_s": 4})
    wait_for_runs(chaos, job_id, 1)

    pool.send(signal.SIGKILL)  # nothing forwards a signal now: the kernel tells the worker

    wait_until(lambda: not os.path.exists(f"/proc/{worker}"), 60, "the orphaned worker to exit")
    assert chaos.status(job_id) == "finished"
    assert runs_of(chaos, job_id) == 1
