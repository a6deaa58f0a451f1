"""``make demo`` (``python -m worker.dev.demo``) never touches a queue it did not create.

The Redis at REDIS_URL stands for a live fleet's: its ``agents`` queue holds a task the demo
must neither run nor move. By default the demo starts a throwaway redis-server; with
DEMO_REDIS_URL it borrows that Redis under a queue of its own and leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.workers import REPO_ROOT
from worker.enqueue import enqueue_task

pytestmark = pytest.mark.integration

GUIDE_LLM_URL = "http://127.0.0.1:9/v1"
LIVE_TASK = {"task_id": "live-1", "type": "exploration", "agent_id": "fleet-agent"}


def run_demo(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REDIS_", "RQ_", "HUB_", "OPENAI_", "ANTHROPIC_", "MCP_", "DEMO_"))
    }
    env.update(PYTHONPATH=str(REPO_ROOT), **variables)
    return subprocess.run(
        [sys.executable, "-m", "worker.dev.demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def fleet_is_untouched(redis_conn: redis.Redis) -> None:
    assert redis_conn.lrange("rq:queue:agents", 0, -1) == [b"live-1"]
    assert redis_conn.hget("rq:job:live-1", "status") == b"queued"
    assert [key for key in redis_conn.scan_iter(match="*demo-*")] == []


def test_demo_in_the_guides_shell_uses_a_throwaway_redis_and_the_scripted_model(
    redis_url: str, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, LIVE_TASK)
    # What docs/first-agent.md leaves exported (its scripted endpoint, stopped since).
    guide = {"OPENAI_API_KEY": "sk-guide-8f3b61d2c74e905a", "OPENAI_BASE_URL": GUIDE_LLM_URL}
    completed = run_demo(tmp_path, REDIS_URL=redis_url, **guide)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "Redis: a throwaway redis-server, queue agents" in completed.stdout
    assert re.search(
        r"^Model: the built-in scripted demo model at http://127\.0\.0\.1:\d+/v1 ",
        completed.stdout,
        re.M,
    )
    assert (
        "OPENAI_API_KEY set in this shell, not used: "
        f"DEMO_MODEL=openai runs the demo against {GUIDE_LLM_URL}" in completed.stdout
    )
    assert '"outcome": "completed"' in completed.stdout
    # The exploration ends with the structured answer the worker asked for.
    assert "not a valid DiscoveryAnswer" not in completed.stdout
    assert '"detail": "no post to respond to (confidence 0.9)"' in completed.stdout
    fleet_is_untouched(redis_conn)


def test_demo_on_a_borrowed_redis_uses_its_own_queue_and_cleans_up(
    redis_url: str, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, LIVE_TASK)
    completed = run_demo(tmp_path, REDIS_URL=redis_url, DEMO_REDIS_URL=redis_url)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"Redis: {redis_url}, queue demo-" in completed.stdout
    fleet_is_untouched(redis_conn)
    assert redis_conn.smembers("rq:queues") == {b"rq:queue:agents"}


def test_demo_without_redis_server_borrows_redis_url_under_its_own_queue(
    redis_url: str, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, LIVE_TASK)
    # Only the venv's scripts on PATH: no redis-server binary to start a throwaway one.
    completed = run_demo(tmp_path, REDIS_URL=redis_url, PATH=str(Path(sys.executable).parent))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"Redis: {redis_url}, queue demo-" in completed.stdout
    fleet_is_untouched(redis_conn)
    assert redis_conn.smembers("rq:queues") == {b"rq:queue:agents"}
