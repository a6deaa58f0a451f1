"""What a task run in a job thread of a concurrent worker changes: its lease names the run,
it watches no parent, rq's timeout reaches its thread, and the tests' concurrency switch."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import fakeredis
import pytest
from redis import BlockingConnectionPool, Redis
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.timeouts import JobTimeoutException, TimerDeathPenalty, UnixSignalDeathPenalty

from tests.support.fake_redis import FakeRedisClients
from tests.support.workers import (
    TEST_CONCURRENCY_VARIABLE,
    TestAgentWorker,
    with_test_concurrency,
)
from worker.coordination import (
    LeaseLost,
    RedisControl,
    TaskLease,
    WorkerLost,
    current_lease_holder,
    in_process_run,
    release_lease_of,
    running_in_process,
)
from worker.coordination._leases import lease_holder
from worker.daemon import AgentWorker
from worker.daemon._concurrent import JobThreadsWorker, threaded_variant
from worker.daemon._job_threads import InFlightJob, JobThreadDeathPenalty, size_connection_pool
from worker.daemon._stopping import StopSignalsWorker
from worker.daemon._unloadable import UnloadableJobsWorker
from worker.redis_io import keys as redis_keys
from worker.settings import settings


def test_a_forked_job_process_holds_leases_as_host_and_pid() -> None:
    assert current_lease_holder() == f"{socket.gethostname()}:{os.getpid()}"
    assert not running_in_process()


def test_two_runs_in_one_process_hold_leases_under_different_names() -> None:
    with in_process_run("exec-a"):
        first = current_lease_holder()
        assert running_in_process()
    with in_process_run("exec-b"):
        second = current_lease_holder()
    assert (
        first
        == lease_holder(os.getpid(), "exec-a")
        == f"{socket.gethostname()}:{os.getpid()}/exec-a"
    )
    assert first != second
    assert not running_in_process()  # the mark ends with its block


def test_a_second_copy_in_the_same_process_does_not_get_the_lease(
    redis: fakeredis.FakeRedis,
) -> None:
    redis.hset("rq:job:t-1", "origin", "agents")  # the first run is rq's running execution
    redis.zadd(StartedJobRegistry("agents", connection=redis).key, {"t-1:exec-a": time.time() + 60})
    with in_process_run("exec-a"):
        first = TaskLease(redis, "t-1", holder=current_lease_holder(), ttl_s=30, renew=False)
        assert first.acquire()
    with in_process_run("exec-b"):
        second = TaskLease(redis, "t-1", holder=current_lease_holder(), ttl_s=30, renew=False)
        assert not second.acquire()


def test_the_worker_frees_only_the_lease_of_the_run_it_names(redis: fakeredis.FakeRedis) -> None:
    with in_process_run("exec-a"):
        assert TaskLease(
            redis, "t-1", holder=current_lease_holder(), ttl_s=30, renew=False
        ).acquire()

    assert not release_lease_of(redis, "t-1", os.getpid())  # the process alone is not the run
    assert not release_lease_of(redis, "t-1", os.getpid(), "exec-b")
    assert release_lease_of(redis, "t-1", os.getpid(), "exec-a")
    assert redis.exists(redis_keys.task_lease("t-1")) == 0


@pytest.mark.anyio
async def test_a_run_in_the_worker_process_watches_no_parent_and_checks_its_own_lease(
    redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    with in_process_run("exec-a"):
        control = RedisControl(redis, "t-1")
    # The worker's own parent (a shell, systemd) going away means nothing to the task.
    monkeypatch.setattr(os, "getppid", lambda: 424242)
    redis.set(redis_keys.task_lease("t-1"), lease_holder(os.getpid(), "exec-a"))
    assert not (await control.poll()).cancelled
    redis.set(redis_keys.task_lease("t-1"), lease_holder(os.getpid(), "exec-b"))
    with pytest.raises(LeaseLost, match="exec-b"):
        await control.poll()


@pytest.mark.anyio
async def test_a_forked_job_process_still_stops_when_its_worker_is_gone(
    redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = RedisControl(redis, "t-1")
    monkeypatch.setattr(os, "getppid", lambda: 424242)
    with pytest.raises(WorkerLost):
        await control.poll()


def threaded_worker(connection: Redis, concurrency: int = 4) -> JobThreadsWorker:
    """An AgentWorker built as a host running ``concurrency`` tasks at once builds it."""
    worker = threaded_variant(AgentWorker)(["agents"], connection=connection)
    worker.concurrency = concurrency
    assert isinstance(worker, AgentWorker)
    return worker


def test_rqs_timeout_reaches_a_job_thread_through_a_timer(fake_redis: FakeRedisClients) -> None:
    worker = threaded_worker(fake_redis())
    seen: list[type] = []
    outcome: list[str] = []

    def job_thread() -> None:
        penalty = worker.death_penalty_class
        seen.append(penalty)
        try:
            with penalty(1, JobTimeoutException, job_id="t-1"):
                threading.Event().wait(5)  # sleeps in slices: the timer's exception lands
                for _ in range(10_000_000):
                    pass
            outcome.append("ran to the end")
        except JobTimeoutException as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=job_thread)
    thread.start()
    thread.join(10)
    assert worker.death_penalty_class is UnixSignalDeathPenalty  # rq's SIGALRM, main thread
    assert seen == [JobThreadDeathPenalty]
    assert issubclass(JobThreadDeathPenalty, TimerDeathPenalty)
    assert outcome == ["Task exceeded maximum timeout value (1 seconds)"]


@pytest.fixture
def worker_concurrency(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Set WORKER_CONCURRENCY for the settings the worker reads as it is built."""

    def use(value: str) -> None:
        monkeypatch.setenv("WORKER_CONCURRENCY", value)
        settings.cache_clear()

    yield use
    settings.cache_clear()


def test_a_worker_rq_builds_to_read_a_record_reads_no_settings_and_starts_nothing(
    fake_redis: FakeRedisClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rq info` and Worker.all() build the class with prepare_for_work=False (trap 1).
    def no_settings() -> None:
        raise AssertionError("settings read")

    monkeypatch.setattr("worker.daemon._worker.settings_or_exit", no_settings)
    worker = AgentWorker(["agents"], connection=fake_redis(), prepare_for_work=False)
    assert type(worker) is AgentWorker and worker.concurrency == 1
    started = [t.name for t in threading.enumerate() if t.name.startswith(("job ", "heartbeats"))]
    assert started == []


def test_a_worker_forks_a_job_process_per_job_unless_it_runs_several_tasks_at_once(
    fake_redis: FakeRedisClients, worker_concurrency: Callable[[str], None]
) -> None:
    worker_concurrency("1")
    assert type(AgentWorker(["agents"], connection=fake_redis())) is AgentWorker

    worker_concurrency("4")
    threaded = AgentWorker(["agents"], connection=fake_redis())
    assert isinstance(threaded, JobThreadsWorker) and isinstance(threaded, AgentWorker)
    # Operators, logs and `rq info` see the class they passed.
    assert type(threaded).__name__ == "AgentWorker"
    assert type(threaded).__module__ == AgentWorker.__module__


def test_a_subclass_built_threaded_keeps_what_it_adds_and_overrides_above_the_mode(
    fake_redis: FakeRedisClients, worker_concurrency: Callable[[str], None]
) -> None:
    worker_concurrency("4")
    worker = TestAgentWorker(["agents"], connection=fake_redis())
    assert isinstance(worker, JobThreadsWorker)
    assert type(worker).__name__ == "TestAgentWorker"
    assert "tests.support.jobs.echo_task" in worker.allowed_functions
    mro = type(worker).__mro__
    assert mro.index(AgentWorker) < mro.index(JobThreadsWorker) < mro.index(StopSignalsWorker)
    # AgentWorker's HEARTBEAT_GRACE_S applies over the mode's floor, as one class did.
    worker._heartbeat_grace_s = 30
    job = Job.create("worker.jobs.run_task", args=[{}], id="t-1", connection=worker.connection)
    job.timeout = 1
    assert worker.get_heartbeat_ttl(job) == int(worker.job_monitoring_interval) + 30


def test_the_tests_switch_makes_every_worker_concurrent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_CONCURRENCY_VARIABLE, raising=False)
    assert with_test_concurrency({"A": "1"}) == {"A": "1"}
    monkeypatch.setenv(TEST_CONCURRENCY_VARIABLE, "8")
    assert with_test_concurrency({"A": "1"}) == {"A": "1", "WORKER_CONCURRENCY": "8"}
    # A test that chose its own concurrency keeps it.
    assert with_test_concurrency({"WORKER_CONCURRENCY": "2"}) == {"WORKER_CONCURRENCY": "2"}


def test_a_lease_of_a_run_whose_worker_died_is_taken_over_once_rq_called_it_abandoned(
    redis: fakeredis.FakeRedis,
) -> None:
    dead_holder = lease_holder(4242, "exec-dead")
    redis.set(redis_keys.task_lease("t-1"), dead_holder)
    redis.hset("rq:job:t-1", "origin", "agents")
    started = StartedJobRegistry("agents", connection=redis)
    # rq's heartbeats of the run still keep its execution in the started registry.
    redis.zadd(started.key, {"t-1:exec-dead": time.time() + 60})
    rerun = TaskLease(redis, "t-1", holder=lease_holder(os.getpid(), "exec-new"), ttl_s=30)
    try:
        assert not rerun.acquire()

        # Its worker died: no more heartbeats, and rq's maintenance dropped the execution.
        redis.zrem(started.key, "t-1:exec-dead")
        assert rerun.acquire()
        assert rerun.holder() == lease_holder(os.getpid(), "exec-new")
    finally:
        rerun.release()


def test_a_forked_job_process_lease_is_never_taken_over(redis: fakeredis.FakeRedis) -> None:
    redis.set(redis_keys.task_lease("t-1"), lease_holder(4242))
    rerun = TaskLease(redis, "t-1", holder=lease_holder(os.getpid(), "exec-new"), ttl_s=30)
    assert not rerun.acquire()
    assert rerun.holder() == lease_holder(4242)


def test_rqs_stop_job_cancels_a_task_running_in_a_job_thread(fake_redis: FakeRedisClients) -> None:
    connection = fake_redis()
    worker = threaded_worker(connection, concurrency=4)
    job = Job.create("worker.jobs.run_task", args=[{}], id="t-1", connection=connection)
    execution = Execution(id="exec-1", job_id="t-1", connection=connection)
    worker._in_flight["exec-1"] = InFlightJob(
        job=job, queue=Queue("agents", connection=connection), execution=execution
    )

    worker.request_stop_execution("exec-1")  # what rq's pubsub thread calls for stop-execution

    # A thread cannot be killed: the task is cancelled and stops at its next step.
    assert connection.exists(redis_keys.cancel_flag("t-1")) == 1


def test_a_burst_worker_looks_again_when_a_run_ended_during_its_empty_look(
    fake_redis: FakeRedisClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI met: the queue looked empty, then the one run in flight put its retry back
    and ended before the worker asked whether anything was in flight."""
    connection = fake_redis()
    worker = threaded_worker(connection, concurrency=2)
    queue = Queue("agents", connection=connection)
    job = Job.create("worker.jobs.run_task", args=[{}], id="t-1", connection=connection)
    worker._in_flight["exec-1"] = InFlightJob(
        job=job, queue=queue, execution=Execution(id="exec-1", job_id="t-1", connection=connection)
    )
    looks: list[str] = []

    def look(self: AgentWorker, timeout: int | None, max_idle_time: int | None = None) -> object:
        if not looks:
            looks.append("empty")
            worker._end_flight("exec-1")  # the retry is back in the queue meanwhile
            return None
        looks.append("retry")
        return (job, queue)

    monkeypatch.setattr(UnloadableJobsWorker, "dequeue_job_and_maintain_ttl", look)

    assert worker.dequeue_job_and_maintain_ttl(None) == (job, queue)
    assert looks == ["empty", "retry"]


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 19), (40, 136), (500, 1516)])
def test_the_redis_pool_lets_every_task_in_flight_connect_at_once(
    concurrency: int, expected: int
) -> None:
    # redis-py's pool stops at 100 connections: 500 tasks in one process ran out of them.
    # Three per task (job thread, lease and slot renewals), and a full pool waits.
    connection = Redis()  # no server needed: only the pool's size is read
    size_connection_pool(connection, concurrency)

    assert connection.connection_pool.max_connections == expected
    assert isinstance(connection.connection_pool, BlockingConnectionPool)
