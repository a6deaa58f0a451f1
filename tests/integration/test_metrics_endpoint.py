"""``/metrics`` and ``/healthz`` served by a real worker parent while forked jobs run."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest
import redis
from rq import Queue

from tests.support.redis_server import free_port
from tests.support.workers import TestAgentWorker, running_worker, wait_until
from worker.enqueue import _enqueue_call
from worker.task import parse_task

pytestmark = pytest.mark.integration

TASKS_DONE = 'agent_tasks_total{agent="devops-agent",outcome="completed",type="notification"}'
SAMPLE = re.compile(r"^(?P<series>[a-zA-Z_:][^ ]*) (?P<value>\S+)$")


def enqueue_metrics_job(connection: redis.Redis, task_id: str) -> None:
    task = parse_task(
        {"task_id": task_id, "type": "notification", "agent_id": "devops-agent", "post_id": "p-1"}
    )
    _enqueue_call(
        connection,
        task,
        function_name="tests.support.jobs.record_metrics",
        queue_name="agents",
        result_ttl_s=3600,
        timeout_grace_s=60,
        delay_s=0,
        attempt=0,
    )


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(exposition: str) -> dict[str, float]:
    found = {}
    for line in exposition.splitlines():
        match = SAMPLE.match(line)
        if match:
            found[match["series"]] = float(match["value"])
    return found


def scrape_when(url: str, series: str, expected: float) -> str:
    """Scrape until ``series`` shows ``expected`` (the parent applies a job's metrics on exit)."""

    def scraped() -> str | None:
        status, body = get(url)
        return body if status == 200 and samples(body).get(series) == expected else None

    body = wait_until(scraped, 60, f"{series} == {expected}")
    assert body is not None
    return body


def test_parent_serves_job_metrics_and_health_without_growth(
    redis_conn: redis.Redis, redis_url: str
) -> None:
    wanted_port = free_port()
    with running_worker(redis_url, metrics_port=wanted_port) as worker:
        started = worker.wait_for_event("worker_started")
        assert started["pid"] == worker.process.pid
        port = started["metrics_port"]
        assert port == wanted_port
        base = f"http://127.0.0.1:{port}"
        assert get(f"{base}/healthz") == (200, "ok\n")
        assert len(TestAgentWorker.all(connection=redis_conn)) == 1

        enqueue_metrics_job(redis_conn, "m-0")
        Queue("agents", connection=redis_conn).enqueue(  # pickle: undecodable here
            "tests.support.jobs.echo_task", {"task_id": "x"}, job_id="pickled"
        )
        first = scrape_when(f"{base}/metrics", TASKS_DONE, 1)
        first = scrape_when(f"{base}/metrics", "agent_jobs_undecodable_total", 1)

        values = samples(first)
        assert values['agent_llm_tokens_total{direction="input",model="claude-test"}'] == 120
        assert values['agent_llm_calls_total{model="claude-test",provider="anthropic",status="ok"}']
        assert values['agent_tool_calls_total{outcome="ok",server="hub",tool="search_posts"}'] == 1
        assert values['agent_grant_denials_total{agent="devops-agent",tool="hub__create_post"}']
        assert values["agent_errors_posted_total"] == 1
        assert values['agent_cost_usd_total{agent="devops-agent"}'] == 0.01
        assert values['agent_task_duration_seconds_count{type="notification"}'] == 1
        assert values['agent_queue_jobs{queue="agents",state="finished"}'] == 1
        assert values['agent_queue_jobs{queue="agents",state="failed"}'] == 1
        assert values["agent_outbox_items"] == 0

        for number in range(1, 51):
            enqueue_metrics_job(redis_conn, f"m-{number}")
        after = scrape_when(f"{base}/metrics", TASKS_DONE, 51)

        assert samples(after).keys() == samples(first).keys()
        assert len(after.splitlines()) == len(first.splitlines())
        # Only digits of values may grow; no series or file is added per job.
        assert len(after) - len(first) < len(first) // 20
        assert samples(after)['agent_queue_jobs{queue="agents",state="finished"}'] == 51

    assert worker.process.returncode == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/healthz", timeout=5)


def test_scrape_passes_promtool(redis_conn: redis.Redis, redis_url: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package: prometheus); exposition not linted")
    with running_worker(redis_url, metrics_port=free_port()) as worker:
        port = worker.wait_for_event("worker_started")["metrics_port"]
        enqueue_metrics_job(redis_conn, "m-0")
        exposition = scrape_when(f"http://127.0.0.1:{port}/metrics", TASKS_DONE, 1)

    checked: Any = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition.encode(),
        capture_output=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def test_taken_port_moves_to_the_next_free_one(redis_url: str) -> None:
    wanted = free_port()
    with running_worker(redis_url, metrics_port=wanted) as holder:
        held = holder.wait_for_event("worker_started")["metrics_port"]
        with running_worker(redis_url, metrics_port=wanted) as second:
            moved = second.wait_for_event("metrics_port_taken")
            port = second.wait_for_event("worker_started")["metrics_port"]

            assert held == wanted
            assert (moved["wanted_port"], moved["port"]) == (wanted, port)
            assert wanted < port <= wanted + 16
            assert get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
