"""What an operator reads stays readable: the worker's stderr stays one JSON object per line
through a Redis outage (rq's scheduler process included), and an ``agent-worker`` command
whose reader stopped early (``| head -1``) ends without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis

from tests.support.redis_server import RedisServer, free_port, spawn_redis
from tests.support.workers import launch_worker, parse_events, wait_until, worker_env
from worker.dev.devstack import redis_server_command
from worker.hub_writes import OutboxItem
from worker.hub_writes._outbox import bury

pytestmark = pytest.mark.integration

AGENT_WORKER = str(Path(sys.executable).parent / "agent-worker")


def test_a_redis_outage_leaves_only_json_lines_in_the_worker_log(tmp_path: Path) -> None:
    port = free_port()
    redis = RedisServer(
        port=port,
        process=spawn_redis(redis_server_command(port, str(tmp_path))),
        workdir=str(tmp_path),
    )
    wait_until(lambda: redis.ask(lambda client: client.ping()), 30, "redis-server")
    with tempfile.TemporaryDirectory(prefix="test-outage-") as workdir:
        stderr_path = Path(workdir) / "stderr.log"
        with stderr_path.open("wb") as stderr_file:
            # Commands give up on the dead Redis after 3 s here, not the default 33 s.
            env = {**worker_env(redis.url), "REDIS_PATIENCE_S": "3"}
            process = launch_worker(env, stderr=stderr_file)
        try:
            read = lambda: stderr_path.read_text(encoding="utf-8", errors="replace")  # noqa: E731
            wait_until(lambda: "Scheduler for agents started" in read(), 120, "rq's scheduler")
            redis.kill()
            # The scheduler process outlives the connection's retry, then stops.
            (stopped,) = wait_until(
                lambda: parse_events(read(), "scheduler_stopped"), 180, "the scheduler to stop"
            )
            assert stopped["reason"] == "redis_unavailable"
            # Asked to stop while idle, it does not wait out the outage first.
            process.terminate()
            assert process.wait(timeout=60) == 0
        finally:
            process.kill()
            process.wait(timeout=10)
            redis.stop()
        lines = read().splitlines()
    assert parse_events("\n".join(lines), "worker_stopped")
    # The stop signal's write to Redis met the outage: noted, not raised into rq's loop.
    outages = parse_events("\n".join(lines), "redis_unavailable")
    assert "set_shutdown_requested_date" in {event["during"] for event in outages}
    not_json = [line for line in lines if not line.startswith("{")]
    assert not_json == [], "\n".join(not_json[:40])
    for line in lines:
        event = json.loads(line)
        assert "Traceback" not in json.dumps(event), event


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["--help"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(
    redis_url: str, command: list[str]
) -> None:
    # The read end is closed before the command writes: every write meets a closed pipe,
    # as it does behind `| head -1` once head has its line.
    process = subprocess.Popen(
        [AGENT_WORKER, *command],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "REDIS_URL": redis_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) in {0, 141}
    assert stderr == ""


def test_dead_letters_list_masks_a_secret_in_a_refusal_whole_before_its_preview_cut(
    redis_url: str, redis_conn: redis.Redis
) -> None:
    hub_key = "hub-operator-key-4b1e9d0c7a2f"
    # The Hub's refusal quoted the key, at the preview's edge (it keeps 80 characters).
    refusal = "HTTP 403 from the Hub: " + "x" * 40 + f" key {hub_key} is not allowed here"
    item = OutboxItem(kind="post", payload={"content": "hi"}, idempotency_key="t-1:post:")
    bury(redis_conn, item, refusal)
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": redis_url, "HUB_API_KEY": hub_key}

    listed = [
        subprocess.run(
            [AGENT_WORKER, "dead-letters", "list", *extra],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )
        for extra in ([], ["--json"])
    ]  # fmt: skip

    for completed in listed:
        assert completed.returncode == 0, completed.stderr
        assert "t-1:post:" in completed.stdout and "[REDACTED]" in completed.stdout
        assert hub_key[:8] not in completed.stdout
