"""The producer side as a Hub in another language sees it, and what a re-enqueue does.

The `redis-cli` session of docs/contract.md runs as written against a real redis-server,
then a real `rq worker agents` runs the task it wrote. A task id that already ran is a
duplicate (its report stays) unless `agent-worker enqueue --rerun` asks to run it again.
A scripted scenario out of turns fails the task instead of posting a placeholder.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.support.definitions import SHIPPED_DEMO_AGENTS
from tests.support.devhub import DevHub, running_devhub
from tests.support.scripted_llm import ScriptedLlm, running_scripted_llm
from tests.support.workers import run_burst

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "docs" / "contract.md"
BIN = Path(sys.executable).parent
HUB_KEY = "hub-contract-3f9a17c2d84e6b05"
MODEL_KEY = "sk-contract-9b2e4d71a0c6f583"


def contract_session() -> str:
    section = CONTRACT.read_text(encoding="utf-8").split("## Enqueueing from another language")[1]
    (block,) = re.findall(r"^```sh\n(.*?)^```$", section.split("\n## ")[0], re.S | re.M)
    return str(block)


@pytest.fixture(scope="module")
def outside() -> Iterator[tuple[DevHub, ScriptedLlm]]:
    with running_devhub(api_key=HUB_KEY) as hub, running_scripted_llm() as llm:
        yield hub, llm


def worker_env(redis_url: str, hub: DevHub, llm: ScriptedLlm) -> dict[str, str]:
    return {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "RQ_WORKER_CLASS": "worker.AgentWorker",
        "RQ_CONFIG": "worker.rq_config",
        "REDIS_URL": redis_url,
        "AGENTS_DIR": str(SHIPPED_DEMO_AGENTS),
        "HUB_URL": hub.url,
        "HUB_API_KEY": HUB_KEY,
        "OPENAI_BASE_URL": llm.openai_base_url,
        "OPENAI_API_KEY": MODEL_KEY,
        "METRICS_PORT": "0",
    }


def report_of(connection: redis.Redis, task_id: str) -> dict[str, Any]:
    job = Job.fetch(task_id, connection=connection, serializer=JSONSerializer)
    report: dict[str, Any] = job.get_meta(refresh=True)["report"]
    return report


def run_session(redis_url: str) -> str:
    completed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", contract_session()],
        env={"PATH": "/usr/bin:/bin", "REDIS_URL": redis_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def test_the_redis_cli_session_enqueues_a_task_a_real_worker_runs(
    redis_url: str, redis_conn: redis.Redis, outside: tuple[DevHub, ScriptedLlm], tmp_path: Path
) -> None:
    hub, llm = outside
    llm.set_scenario("gpt-4o-mini", [{"text": "Explored from a task redis-cli wrote."}])

    assert run_session(redis_url) == "1"
    assert run_session(redis_url) == "0"  # waiting: a duplicate

    burst = run_burst(worker_env(redis_url, hub, llm), timeout_s=180, cwd=tmp_path)
    assert burst.returncode == 0, burst.stderr
    report = report_of(redis_conn, "cli-1")
    assert (report["outcome"], report["output"]) == (
        "completed",
        "Explored from a task redis-cli wrote.",
    )
    assert run_session(redis_url) == "3"  # it ran: its report stays
    assert report_of(redis_conn, "cli-1")["output"] == "Explored from a task redis-cli wrote."


def agent_worker(
    redis_url: str, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "agent-worker"), *args],
        env={"PATH": f"{BIN}:/usr/bin:/bin", "REDIS_URL": redis_url},
        input=input_text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def agent_worker_enqueue(redis_url: str, task: dict[str, Any], *flags: str) -> str:
    completed = agent_worker(redis_url, "enqueue", *flags, "-", input_text=json.dumps(task))
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def test_a_finished_task_runs_again_only_when_asked(
    redis_url: str, redis_conn: redis.Redis, outside: tuple[DevHub, ScriptedLlm], tmp_path: Path
) -> None:
    hub, llm = outside
    env = worker_env(redis_url, hub, llm)
    task = {"task_id": "again-1", "type": "exploration", "agent_id": "demo-agent"}
    llm.set_scenario("gpt-4o-mini", [{"text": "first run"}, {"text": "second run"}])
    assert agent_worker_enqueue(redis_url, task) == "enqueued again-1"
    assert run_burst(env, timeout_s=180, cwd=tmp_path).returncode == 0
    assert report_of(redis_conn, "again-1")["output"] == "first run"

    assert agent_worker_enqueue(redis_url, task) == (
        "duplicate again-1 (it already ran; --rerun runs it again)"
    )
    assert redis_conn.llen("rq:queue:agents") == 0
    assert report_of(redis_conn, "again-1")["output"] == "first run"

    assert agent_worker_enqueue(redis_url, task, "--rerun") == "enqueued again-1"
    assert run_burst(env, timeout_s=180, cwd=tmp_path).returncode == 0
    assert report_of(redis_conn, "again-1")["output"] == "second run"


def test_a_scenario_out_of_turns_fails_the_task_and_posts_no_reply(
    redis_url: str, redis_conn: redis.Redis, outside: tuple[DevHub, ScriptedLlm], tmp_path: Path
) -> None:
    hub, llm = outside
    llm.reset()  # no turn scripted at all
    post_id = hub.seed_post("Hello @demo-agent, anyone there?")
    task = {
        "task_id": "no-turn-1",
        "type": "notification",
        "agent_id": "demo-agent",
        "post_id": post_id,
    }
    assert agent_worker_enqueue(redis_url, task) == "enqueued no-turn-1"

    assert run_burst(worker_env(redis_url, hub, llm), timeout_s=180, cwd=tmp_path).returncode == 0

    report = report_of(redis_conn, "no-turn-1")
    assert report["outcome"] == "model_error"
    assert "no turn left" in report["error"]["message"]
    comments = [c for c in hub.state()["comments"] if c["post_id"] == post_id]
    assert comments == []


def test_a_requeued_tasks_reason_and_next_try_are_shown_by_status_and_report(
    redis_url: str, redis_conn: redis.Redis, outside: tuple[DevHub, ScriptedLlm], tmp_path: Path
) -> None:
    hub, llm = outside
    llm.set_scenario("gpt-4o-mini", [{"status": 503, "error": {"message": "overloaded"}}])
    task = {"task_id": "later-1", "type": "exploration", "agent_id": "demo-agent"}
    assert agent_worker_enqueue(redis_url, task) == "enqueued later-1"
    env = {**worker_env(redis_url, hub, llm), "LLM_MAX_RETRIES": "0", "REQUEUE_DELAY_S": "60"}

    assert run_burst(env, timeout_s=180, cwd=tmp_path).returncode == 0

    due = redis_conn.zscore("rq:scheduled:agents", "later-1")
    assert due is not None
    status = json.loads(agent_worker(redis_url, "status", "--json").stdout)
    (requeued,) = status["requeued"]
    assert (requeued["task_id"], requeued["agent_id"], requeued["attempt"]) == (
        "later-1",
        "demo-agent",
        1,
    )
    assert "503" in requeued["reason"]
    next_try = requeued["next_try_at"]
    assert abs(datetime.fromisoformat(next_try).timestamp() - due) < 1
    table = agent_worker(redis_url, "status").stdout
    assert "REQUEUED (1)" in table and "later-1" in table and "503" in table
    report = agent_worker(redis_url, "report", "later-1")
    assert report.returncode == 2
    assert report.stderr.strip() == (
        f"agent-worker report: later-1: no report yet (status scheduled): requeued for "
        f"attempt 1, next try at {next_try}: {requeued['reason']}"
    )
