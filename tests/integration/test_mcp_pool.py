"""Pooled stdio MCP servers against the real toolkit server: shared, per-call identity,
concurrent use from several threads, restart after a crash, and their own clean-up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.support.fake_redis import FakeRedisClients
from tests.support.jobs import enqueue_test_job
from tests.support.mcp_test_servers.launch import stdio_entry
from tests.support.workers import RQ, parse_events, run_burst_worker, worker_env
from worker.exceptions import ToolFailed, ToolServerDown
from worker.redis_io import kill_recorded_process_groups
from worker.redis_io._children import register_child_process
from worker.tools import close_stdio_pool
from worker.tools._base import CallContext
from worker.tools._config import McpConfig
from worker.tools._grants import EffectiveGrants
from worker.tools._mcp import McpToolbox, fixed_capability
from worker.tools._pool import StdioPool, stdio_pool
from worker.tools._tool_cache import tool_lists

pytestmark = [pytest.mark.integration]

KIT_TOOLS = {"*": "kit:read", "crash": "kit:admin"}
GRANTS = EffectiveGrants.of(["kit:*"])
CAPABILITY = "capability-of-the-task"


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    """Each test starts and ends with no pooled server and no cached tool list."""
    close_stdio_pool()
    tool_lists.clear()
    yield
    close_stdio_pool()
    tool_lists.clear()


def pooled_config(**extra: Any) -> McpConfig:
    entry = stdio_entry("toolkit", KIT_TOOLS, pool=True, first_party=True, **extra)
    return McpConfig.model_validate({"servers": {"kit": entry}})


def context(task_id: str, agent_id: str = "agent-a", step: int = 1) -> CallContext:
    return CallContext(task_id=task_id, agent_id=agent_id, step=step, index=0, timeout_s=30.0)


async def run_task(
    config: McpConfig, task_id: str, agent_id: str = "agent-a", **open_options: Any
) -> dict[str, Any]:
    """One task's toolbox: the server's pid and the ``_meta`` it saw for this task's call."""
    capability = f"{CAPABILITY}-{task_id}"
    async with McpToolbox.open(
        config, grants=GRANTS, capability=fixed_capability(capability), **open_options
    ) as toolbox:
        assert toolbox.unavailable_servers == {}
        pid = int((await toolbox.call("kit__pid", {}, context(task_id, agent_id))).content)
        echoed = await toolbox.call("kit__echo", {"text": task_id}, context(task_id, agent_id))
    return {"pid": pid, "meta": json.loads(echoed.content)["meta"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until_gone(pid: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"process {pid} still runs"


def test_two_tasks_share_one_process_and_each_call_carries_its_own_task() -> None:
    config = pooled_config()
    spawned: list[int] = []
    first = anyio.run(run_task, config, "task-1", "agent-a")
    second = anyio.run(lambda: run_task(config, "task-2", "agent-b", on_spawn=spawned.append))

    assert first["pid"] == second["pid"]
    assert stdio_pool().child_pids() == {first["pid"]}
    assert spawned == []  # the pool's child, not the task's
    for seen, task_id, agent_id in ((first, "task-1", "agent-a"), (second, "task-2", "agent-b")):
        assert seen["meta"]["task_id"] == task_id
        assert seen["meta"]["agent_id"] == agent_id
        assert seen["meta"]["idempotency_key"] == f"{task_id}:tool:1:0"
        # The server got the capability (the toolbox scrubs it from what it echoes back).
        assert seen["meta"]["capability"] == "[capability]"
        assert seen["meta"]["deadline"] > time.time()


def test_each_call_to_a_pooled_server_carries_its_own_tasks_capability(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record.jsonl"
    entry = stdio_entry(
        "recorder", {"*": "kit:read"}, pool=True, first_party=True, env={"RECORD_FILE": str(record)}
    )
    config = McpConfig.model_validate({"servers": {"rec": entry}})

    async def note(task_id: str) -> None:
        async with McpToolbox.open(
            config, grants=GRANTS, capability=fixed_capability(f"{CAPABILITY}-{task_id}")
        ) as toolbox:
            await toolbox.call("rec__note", {"text": task_id}, context(task_id))

    anyio.run(note, "task-1")
    anyio.run(note, "task-2")

    assert len(stdio_pool().child_pids()) == 1
    metas = [json.loads(line)["meta"] for line in record.read_text().splitlines()]
    assert [(m["task_id"], m["capability"]) for m in metas] == [
        ("task-1", f"{CAPABILITY}-task-1"),
        ("task-2", f"{CAPABILITY}-task-2"),
    ]


def test_tasks_in_two_threads_call_the_pooled_server_at_once() -> None:
    config = pooled_config()
    results: dict[str, Any] = {}
    in_flight: dict[str, tuple[float, float]] = {}

    async def slow_task(task_id: str) -> None:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            started = time.monotonic()
            answer = await toolbox.call("kit__slow", {"seconds": 1.5}, context(task_id))
            in_flight[task_id] = (started, time.monotonic())
            results[task_id] = (answer.content, await run_task(config, task_id))

    anyio.run(run_task, config, "warm-up")  # the server is running before the threads start
    threads = [threading.Thread(target=anyio.run, args=(slow_task, f"task-{n}")) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(results) == ["task-1", "task-2"]
    assert {content for content, _ in results.values()} == {"slept 1.5"}
    assert len({seen["pid"] for _, seen in results.values()}) == 1
    assert [results[t][1]["meta"]["task_id"] for t in ("task-1", "task-2")] == ["task-1", "task-2"]
    # Both slow calls were in flight at once, and neither waited for the other to end.
    starts, ends = zip(*in_flight.values(), strict=True)
    assert max(starts) < min(ends), in_flight
    assert all(end - start < 2.9 for start, end in in_flight.values()), in_flight


def test_a_call_past_its_timeout_fails_and_leaves_the_pooled_server_serving() -> None:
    config = pooled_config()

    async def time_out_then_add() -> str:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            hurried = CallContext(
                task_id="task-1", agent_id="agent-a", step=1, index=0, timeout_s=0.5
            )
            started = time.monotonic()
            with pytest.raises(ToolFailed, match=r"tool kit__slow timed out after 0\.5 s"):
                await toolbox.call("kit__slow", {"seconds": 30}, hurried)
            assert time.monotonic() - started < 5
            return (await toolbox.call("kit__add", {"a": 2, "b": 2}, context("task-1"))).content

    assert anyio.run(time_out_then_add) == "4"
    assert len(stdio_pool().child_pids()) == 1


def test_a_killed_pooled_server_is_withdrawn_then_restarted_for_the_next_task() -> None:
    config = pooled_config()

    async def task_that_loses_its_server() -> dict[str, str]:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            pid = int((await toolbox.call("kit__pid", {}, context("task-1"))).content)
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(20):
                while "kit" not in toolbox.unavailable_servers:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert toolbox.offered() == []
            with pytest.raises(ToolServerDown, match="server 'kit' is unavailable"):
                await toolbox.call("kit__add", {"a": 1, "b": 1}, context("task-1"))
            return {"pid": str(pid)}

    lost = anyio.run(task_that_loses_its_server)
    next_task = anyio.run(run_task, config, "task-2")

    assert next_task["pid"] != int(lost["pid"])
    assert next_task["meta"]["task_id"] == "task-2"
    assert stdio_pool().child_pids() == {next_task["pid"]}


def test_pooled_servers_survive_the_per_job_cleanup_and_go_with_the_pool(
    fake_redis: FakeRedisClients,
) -> None:
    redis = fake_redis()
    config = pooled_config()
    seen = anyio.run(
        lambda: run_task(
            config, "job-1", on_spawn=lambda pid: register_child_process(redis, "job-1", pid)
        )
    )
    pid = seen["pid"]

    assert kill_recorded_process_groups(redis, "job-1") == []
    assert alive(pid)
    assert anyio.run(run_task, config, "job-2")["pid"] == pid

    close_stdio_pool()
    wait_until_gone(pid)
    assert stdio_pool().child_pids() == set()


def test_in_a_forked_job_process_the_pool_hands_its_children_to_the_job(
    monkeypatch: pytest.MonkeyPatch,
    fake_redis: FakeRedisClients,
) -> None:
    # What rq's job process finds (forked, leading its own group): a fresh pool that lives
    # as long as its one job.
    child = os.fork()
    if child == 0:
        os.setpgrp()
        os._exit(0 if stdio_pool().job_scoped and not stdio_pool().child_pids() else 1)
    assert os.waitpid(child, 0)[1] == 0
    # A worker rq worker-pool forks stays in the pool's group: its pool is its own.
    child = os.fork()
    if child == 0:
        os._exit(1 if stdio_pool().job_scoped else 0)
    assert os.waitpid(child, 0)[1] == 0
    assert not stdio_pool().job_scoped

    job_pool = StdioPool(job_scoped=True)
    monkeypatch.setattr("worker.tools._pool._pool", job_pool)
    redis = fake_redis()
    try:
        pid = anyio.run(
            lambda: run_task(
                pooled_config(),
                "job-1",
                on_spawn=lambda pid: register_child_process(redis, "job-1", pid),
            )
        )["pid"]
        # The worker parent's cleanup after the job process exits takes the server too.
        assert kill_recorded_process_groups(redis, "job-1") == [pid]
        wait_until_gone(pid)
    finally:
        job_pool.close()


def test_the_tool_list_is_cached_across_tasks_and_dropped_when_a_tool_is_unknown() -> None:
    config = pooled_config()
    identity = config.servers["kit"].identity("kit")
    anyio.run(run_task, config, "task-1")
    listed = tool_lists.get(identity, ttl_s=60)
    assert listed is not None
    assert "echo" in {tool.name for tool in listed}

    # The cached list now claims a tool the server does not have: a task trusts the cache ...
    ghost = mcp_types.Tool(name="ghost", input_schema={"type": "object"})
    tool_lists.put(identity, (*listed, ghost))

    async def call_the_ghost() -> str:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            assert "kit__ghost" in {spec.name for spec in toolbox.offered()}
            result = await toolbox.call("kit__ghost", {}, context("task-2"))
            assert result.is_error
            return result.content

    assert "Unknown tool" in anyio.run(call_the_ghost)
    # ... until the server says the tool is unknown: the next task asks the server again.
    assert tool_lists.get(identity, ttl_s=60) is None

    async def offered_after() -> set[str]:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            return {spec.name for spec in toolbox.offered()}

    assert "kit__ghost" not in anyio.run(offered_after)


def test_a_server_restart_drops_its_cached_list() -> None:
    config = pooled_config()
    identity = config.servers["kit"].identity("kit")
    pid = anyio.run(run_task, config, "task-1")["pid"]
    assert tool_lists.get(identity, ttl_s=60) is not None
    os.kill(pid, signal.SIGKILL)
    wait_until_gone(pid)
    deadline = time.monotonic() + 10
    while tool_lists.get(identity, ttl_s=60) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tool_lists.get(identity, ttl_s=60) is None


def test_a_pooled_server_that_keeps_crashing_backs_off() -> None:
    crashing = {
        "command": sys.executable,
        "args": ["-c", "import sys; sys.exit(3)"],
        "pool": True,
        "tools": {"*": "kit:read"},
    }
    config = McpConfig.model_validate({"servers": {"kit": crashing}})

    async def withdrawn_because() -> str:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            assert toolbox.offered() == []
            return toolbox.unavailable_servers["kit"]

    # The first crash restarts at once; from the second on, the restart waits.
    first, second, third = (anyio.run(withdrawn_because) for _ in range(3))
    assert "crashed" not in first
    assert "crashed" not in second
    assert "pooled server 'kit' crashed 2 times in a row; next start in" in third
    assert stdio_pool().child_pids() == set()


def test_a_forked_job_process_leaves_its_pooled_server_to_the_job_cleanup(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    enqueue_test_job(redis_conn, "pooled", "tests.support.jobs.use_pooled_server")

    run = run_burst_worker(redis_url)

    pid = Job.fetch("pooled", connection=redis_conn, serializer=JSONSerializer).return_value()
    assert isinstance(pid, int)
    try:
        assert run.returncode == 0, run.stderr
        wait_until_gone(pid, timeout_s=30)
        assert [event["pids"] for event in run.events("child_processes_killed")] == [[pid]]
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def stuck_config() -> McpConfig:
    entry = stdio_entry("stuck", {"*": "kit:read"}, pool=True)
    return McpConfig.model_validate({"servers": {"kit": entry}})


def test_a_pooled_server_stuck_at_start_up_is_killed_and_restarted_with_the_crash_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pool that reports each start to on_spawn, so the test sees every process.
    job_pool = StdioPool(job_scoped=True)
    monkeypatch.setattr("worker.tools._pool._pool", job_pool)
    started: list[int] = []

    async def withdrawn_because(connect_timeout_s: float) -> str:
        async with McpToolbox.open(
            stuck_config(),
            grants=GRANTS,
            connect_timeout_s=connect_timeout_s,
            on_spawn=started.append,
        ) as toolbox:
            return toolbox.unavailable_servers["kit"]

    try:
        assert "did not connect within 1 s" in anyio.run(withdrawn_because, 1.0)
        # It ignores SIGTERM and its closed input: the pool kills it all the same.
        wait_until_gone(started[0], timeout_s=30)
        # The first failure restarts at once, as the first crash does.
        anyio.run(withdrawn_because, 1.0)
        assert len(started) == 2
        assert started[1] != started[0]
        # Asked while the second is being stopped (its kill grace lasts ~4 s): the task
        # waits for it to go, then meets the backoff.
        time.sleep(1.5)
        third = anyio.run(withdrawn_because, 30.0)
        assert "pooled server 'kit' crashed 2 times in a row; next start in" in third
        assert len(started) == 2
        wait_until_gone(started[1], timeout_s=30)
    finally:
        job_pool.close()
    assert job_pool.child_pids() == set()


def test_closing_the_pool_stops_a_server_stuck_at_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_pool = StdioPool(job_scoped=True)
    monkeypatch.setattr("worker.tools._pool._pool", job_pool)
    started: list[int] = []
    reasons: list[str] = []

    async def wait_for_it() -> None:
        async with McpToolbox.open(
            stuck_config(), grants=GRANTS, connect_timeout_s=120.0, on_spawn=started.append
        ) as toolbox:
            reasons.append(toolbox.unavailable_servers["kit"])

    task = threading.Thread(target=anyio.run, args=(wait_for_it,))
    task.start()
    try:
        deadline = time.monotonic() + 30
        while not started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started, "the stuck server never started"
        job_pool.close()
        task.join(60)
        assert not task.is_alive()
        # The waiting task is told at once, not at its own 120 s connect timeout.
        assert len(reasons) == 1
        assert "the pool closed" in reasons[0]
        wait_until_gone(started[0], timeout_s=30)
    finally:
        job_pool.close()


def test_no_task_is_handed_a_pooled_server_that_is_closing() -> None:
    config = pooled_config()
    crashed = anyio.run(run_task, config, "task-0")["pid"]

    async def crash_it() -> None:
        async with McpToolbox.open(config, grants=GRANTS) as toolbox:
            with pytest.raises(ToolServerDown):
                await toolbox.call("kit__crash_leaving_helper", {}, context("task-1"))

    anyio.run(crash_it)

    # Its helper shrugs off SIGTERM, so stopping the crashed server takes the whole kill
    # grace; these tasks arrive meanwhile.
    async def tasks_meanwhile() -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        async def one(task_id: str) -> None:
            seen.append(await run_task(config, task_id, connect_timeout_s=60.0))

        async with anyio.create_task_group() as tasks:
            for number in range(8):
                tasks.start_soon(one, f"task-{number + 2}")
        return seen

    seen = anyio.run(tasks_meanwhile)
    pids = {result["pid"] for result in seen}
    assert len(pids) == 1
    assert crashed not in pids
    assert stdio_pool().child_pids() == pids


def test_under_rq_worker_pool_the_pooled_server_outlives_each_task(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    # rq worker-pool's parent imports the worker class (and worker.tools) before it forks
    # its workers; each worker, running tasks in threads, owns its pooled servers.
    task_ids = [f"pooled-{number}" for number in range(4)]
    for task_id in task_ids:
        enqueue_test_job(redis_conn, task_id, "tests.support.jobs.use_pooled_server")
    command = [RQ, "worker-pool", "agents", "-n", "1", "--burst", "-u", redis_url]
    command += ["-w", "tests.support.workers.TestAgentWorker"]
    run = subprocess.run(
        command,
        env={**worker_env(redis_url), "WORKER_CONCURRENCY": "2"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )

    pids = set()
    try:
        assert run.returncode == 0, run.stderr
        for task_id in task_ids:
            job = Job.fetch(task_id, connection=redis_conn, serializer=JSONSerializer)
            assert job.get_status() == "finished", (task_id, job.latest_result())
            pids.add(job.return_value())
        # One server served all four tasks: no task's end took it down.
        assert len(pids) == 1
        assert parse_events(run.stderr, "child_processes_killed") == []
        # The worker stopped it as it exited.
        wait_until_gone(next(iter(pids)), timeout_s=30)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pid, signal.SIGKILL)
