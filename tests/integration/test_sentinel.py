"""A fleet on a Sentinel-managed Redis rides out a primary failover: nothing lost, nothing twice.

Real parts only: a primary, a replica and three sentinels (``redis-server
--sentinel``), two ``rq worker agents`` started as an operator would
(``RQ_CONFIG=worker.rq_config`` with ``REDIS_SENTINELS``), ``agent-worker
enqueue``, the devhub and the scripted model endpoint. The primary is SIGKILLed
while the workers are mid-way through the queue; a delayed task enqueued after the
failover shows rq's scheduler process found the new primary too. Two small tests pin
the redis-py Sentinel bugs ``SentinelPrimaryConnection`` fixes, on one real server.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq.job import JobStatus

from tests.support.e2e import (
    AGENT_WORKER,
    E2E,
    REPO_ROOT,
    AgentWorkerProcess,
    DevHubControl,
    task_events,
)
from tests.support.redis_server import RedisServer, running_redis
from tests.support.scripted_llm import ScriptedLlm
from tests.support.sentinel import MASTER_NAME, SentinelRedis, running_sentinel_redis
from tests.support.workers import wait_until
from worker.dev.devstack import DevStack
from worker.enqueue import enqueue_task
from worker.redis_io import connect, patient_redis_retry
from worker.redis_io._connection import SentinelPrimaryConnection, is_sentinel_managed
from worker.settings import Settings

pytestmark = pytest.mark.integration

RESPONDER = "e2e-responder"
TASKS = 10
# Long enough that the primary dies while tasks are still queued and running.
LLM_DELAY_S = 0.5
ANSWER = "Noted, answered once."
# With sentinels set, REDIS_URL gives only credentials and database: this host is never used.
TEMPLATE_REDIS_URL = "redis://unused-with-sentinels:1/0"


def sentinel_env(setup: SentinelRedis) -> dict[str, str]:
    return {
        "RQ_CONFIG": "worker.rq_config",
        "REDIS_SENTINELS": setup.sentinel_addresses,
        "REDIS_SENTINEL_MASTER": MASTER_NAME,
        "REDIS_URL": TEMPLATE_REDIS_URL,
    }


@pytest.fixture
def sentinel_e2e(stack: DevStack) -> Iterator[tuple[E2E, SentinelRedis]]:
    with running_sentinel_redis() as setup:
        settings = Settings(
            redis_url=TEMPLATE_REDIS_URL,
            redis_sentinels=setup.sentinel_addresses,
            redis_sentinel_master=MASTER_NAME,
        )
        client = connect(settings)
        # The test's own reads ride out the failover as the workers' do.
        client.set_retry(patient_redis_retry())
        assert stack.llm_base_url is not None
        e2e = E2E(
            stack=stack,
            redis=client,
            hub=DevHubControl(stack.hub_url, stack.hub_api_key),
            llm=ScriptedLlm(stack.llm_base_url),
        )
        try:
            e2e.hub.reset()
            e2e.llm.reset()
            yield e2e, setup
        finally:
            client.close()
            e2e.hub.close()


def enqueue_with_cli(e2e: E2E, env: dict[str, str], tasks: list[dict[str, Any]], tmp: Path) -> str:
    source = tmp / "tasks.jsonl"
    source.write_text("\n".join(json.dumps(task) for task in tasks))
    completed = subprocess.run(
        [AGENT_WORKER, "enqueue", str(source)],
        cwd=REPO_ROOT,
        env=e2e.worker_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


@contextlib.contextmanager
def shown_on_failure(setup: SentinelRedis, *workers: AgentWorkerProcess) -> Iterator[None]:
    """A timeout names what the workers and the sentinels saw, to tell a slow failover apart."""
    try:
        yield
    except AssertionError as exc:
        shown = "\n\n".join(worker.stderr[-4000:] for worker in workers)
        raise AssertionError(
            f"{exc}; the workers logged:\n{shown}\n\nthe sentinels:\n{setup.sentinel_logs()}"
        ) from None


def finished(e2e: E2E, task_ids: list[str]) -> bool:
    return all(e2e.job(task_id).get_status() is JobStatus.FINISHED for task_id in task_ids)


def test_a_fleet_on_sentinel_loses_no_task_and_runs_none_twice_across_a_failover(
    sentinel_e2e: tuple[E2E, SentinelRedis], tmp_path: Path
) -> None:
    e2e, setup = sentinel_e2e
    assert is_sentinel_managed(e2e.redis)
    e2e.llm.set_scenario(RESPONDER, [{"text": ANSWER, "delay_s": LLM_DELAY_S}] * (TASKS * 2))
    post_ids = {
        f"failover-{n}": str(
            e2e.hub.create_post(agent_id="alice", content=f"@{RESPONDER} question {n}")["id"]
        )
        for n in range(TASKS)
    }
    tasks = [
        {"task_id": task_id, "type": "notification", "agent_id": RESPONDER, "post_id": post_id}
        for task_id, post_id in post_ids.items()
    ]
    env = sentinel_env(setup)
    printed = enqueue_with_cli(e2e, env, tasks, tmp_path)
    assert printed.split() == [word for task_id in post_ids for word in ("enqueued", task_id)]
    # Replication is asynchronous: the queue must be on the replica before its primary dies.
    assert e2e.redis.wait(1, 5000) == 1
    old_primary = setup.primary.port

    with e2e.worker(**env) as first, e2e.worker(**env) as second:
        wait_until(lambda: len(e2e.hub.state()["comments"]) >= 2, 90, "the first answers")
        assert len(e2e.hub.state()["comments"]) < TASKS, "the failover must happen mid-run"
        setup.primary.kill()
        with shown_on_failure(setup, first, second):
            setup.wait_for_failover()
        # A delayed task (a requeue) runs only if rq's scheduler process found the new primary.
        delayed_post = e2e.hub.create_post(agent_id="alice", content=f"@{RESPONDER} later")
        post_ids["failover-delayed"] = str(delayed_post["id"])
        delayed = {"task_id": "failover-delayed", "type": "notification", "agent_id": RESPONDER}
        enqueue_task(e2e.redis, delayed | {"post_id": post_ids["failover-delayed"]}, delay_s=2)
        with shown_on_failure(setup, first, second):
            wait_until(lambda: finished(e2e, list(post_ids)), 90, "every task to finish")
        # Both rode out the failover, and a warm shutdown still ends them at once: an idle
        # worker's interrupted BLMOVE must not hold up its last commands.
        assert (first.process.poll(), second.process.poll()) == (None, None)
        assert (first.stop(timeout_s=15), second.stop(timeout_s=15)) == (0, 0)
        stderr = first.stderr + second.stderr

    assert e2e.redis.connection_pool.get_master_address()[1] == setup.replica.port != old_primary
    state = e2e.hub.state()
    # Each task answered exactly once, on its own post, and reported its consumption once.
    assert sorted(c["post_id"] for c in state["comments"]) == sorted(post_ids.values())
    assert {c["content"] for c in state["comments"]} == {ANSWER}
    consumption = Counter(record["activation_id"] for record in state["consumption"])
    assert consumption == Counter(list(post_ids))
    for task_id in post_ids:
        assert e2e.report(task_id)["outcome"] == "completed"
        assert len(task_events(stderr, "task_completed", task_id)) == 1, task_id
    # Every task called the model once: none ran (even partly) a second time.
    assert len(e2e.llm.requests(RESPONDER)) == TASKS + 1


def test_a_worker_given_sentinels_without_rq_config_refuses_to_start(
    stack: DevStack, redis_server: RedisServer
) -> None:
    with E2E.on(stack) as e2e:
        # rq connects to REDIS_URL (reachable here), which sentinels make a mere template.
        # The stack's workers run with RQ_CONFIG; an empty value is unset for rq's CLI.
        run = e2e.run_burst(
            REDIS_URL=redis_server.url, REDIS_SENTINELS="127.0.0.1:26379", RQ_CONFIG=""
        )

    assert run.returncode == 2, run.stderr
    assert "REDIS_SENTINELS" in run.stderr and "RQ_CONFIG=worker.rq_config" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_bad_sentinel_address_stops_rq_with_one_line_naming_the_variable(
    stack: DevStack,
) -> None:
    with E2E.on(stack) as e2e:
        run = e2e.run_burst(RQ_CONFIG="worker.rq_config", REDIS_SENTINELS="sentinel-a,:26379")

    assert run.returncode == 2, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if line.strip()]
    assert line.startswith("agent-worker: invalid setting REDIS_SENTINELS:"), line


class Interrupted(BaseException):
    """What rq's SIGTERM handler raises (StopRequested) in the middle of a blocking read."""


def test_a_read_interrupted_by_a_signal_handler_drops_the_connection(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    class PrimaryNamedBySentinels:
        is_master = True
        check_connection = False

        def get_master_address(self) -> tuple[str, int]:
            return ("127.0.0.1", redis_server.port)

    connection = SentinelPrimaryConnection(connection_pool=PrimaryNamedBySentinels())
    connection.connect()
    connection.send_command("BLPOP", "never-pushed", 30)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise Interrupted

    monkeypatch.setattr(connection._parser, "read_response", interrupted)
    with pytest.raises(Interrupted):
        connection.read_response()
    # Kept, it would answer the next command with the pending BLPOP's reply, 30 s later.
    assert connection._sock is None


def test_a_dropped_connection_asks_the_sentinels_again_before_it_reconnects(
    redis_server: RedisServer,
) -> None:
    with running_redis() as new_primary:
        primary = {"address": ("127.0.0.1", redis_server.port)}

        class FailingOverPool:
            is_master = True
            check_connection = False

            def get_master_address(self) -> tuple[str, int]:
                return primary["address"]

        connection = SentinelPrimaryConnection(connection_pool=FailingOverPool())
        connection.connect()
        connection.disconnect()  # the old primary died
        primary["address"] = ("127.0.0.1", new_primary.port)
        # A command sent on the dropped connection, as a retry of redis-py's client does.
        connection.send_command("PING")
        assert connection.read_response() in (b"PONG", "PONG")
        assert connection.port == new_primary.port
        connection.disconnect()
