"""``make demo``: one notification and one exploration task, end to end, on a local stack.

Starts (or reuses) Redis, the devhub, our MCP servers and — without a provider
key — a scripted model endpoint whose demo agent really calls the hub tools;
seeds a post that mentions the demo agent, enqueues the two tasks, runs
``rq worker agents --burst`` with ``RQ_WORKER_CLASS=worker.AgentWorker``, and
prints what the agent posted, the AgentReports and a few metric lines.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import redis
import yaml
from rq.job import Job
from rq.serializers import JSONSerializer

from hub_client import HubClient
from worker.devstack import REDIS_MISSING, DevStack, free_port, running_stack
from worker.enqueue import enqueue_task

DEMO_AGENTS = Path(__file__).resolve().parent / "agents"
AGENT = "demo-agent"
WORKER_TIMEOUT_S = 240
SHOWN_METRICS = (
    "agent_tasks_total",
    "agent_llm_calls_total",
    "agent_tool_calls_total",
    "agent_llm_tokens_total",
)


def reachable_redis() -> str | None:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except (redis.RedisError, OSError):
        return None
    return url


def agents_dir(workdir: Path) -> tuple[Path, str]:
    """The demo agent, pointed at whichever model is available. Returns (dir, model label)."""
    target = workdir / "agents"
    shutil.copytree(DEMO_AGENTS, target)
    config_path = target / "agents" / AGENT / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    if os.environ.get("OPENAI_API_KEY"):
        label = f"openai {config['brain']['model']} (OPENAI_API_KEY is set)"
    elif os.environ.get("ANTHROPIC_API_KEY"):
        config["brain"] = {**config["brain"], "provider": "anthropic", "model": "claude-haiku-4-5"}
        label = "anthropic claude-haiku-4-5 (ANTHROPIC_API_KEY is set)"
    else:
        # The scripted endpoint's built-in demo agent answers requests for model "demo".
        config["brain"] = {**config["brain"], "provider": "openai", "model": "demo"}
        label = "the built-in scripted demo model (no provider key set)"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return target, label


async def seed_post(stack: DevStack) -> str:
    async with HubClient(stack.hub_url, stack.hub_api_key) as hub:
        post = await hub.create_post(
            agent_id="alice",
            title="Scaling our agent workers",
            content=(
                "Hey @demo-agent, our queue keeps growing at peak hours. What is the best way "
                "to scale `rq worker agents` across hosts without running a task twice?"
            ),
            community="m/general",
            idempotency_key="demo-seed-" + secrets.token_hex(4),
        )
        return post.id


def run_worker(stack: DevStack, agents: Path, metrics_file: Path, use_real_keys: bool) -> int:
    env = {
        **os.environ,
        **stack.worker_env(
            AGENTS_DIR=str(agents),
            METRICS_PORT=str(free_port()),
            METRICS_TEXTFILE=str(metrics_file),
        ),
    }
    if use_real_keys:  # keep the operator's real provider endpoint and key
        for name in (
            "OPENAI_BASE_URL",
            "OPENAI_API_KEY",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_API_KEY",
        ):
            if name in os.environ:
                env[name] = os.environ[name]
            else:
                env.pop(name, None)
    rq = Path(sys.executable).with_name("rq")
    print(f"$ RQ_WORKER_CLASS=worker.AgentWorker {rq.name} worker agents --burst")
    completed = subprocess.run(
        [str(rq), "worker", "agents", "--burst"],
        env=env,
        timeout=WORKER_TIMEOUT_S,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    events = [line for line in completed.stderr.splitlines() if '"event"' in line]
    for line in events:
        event = json.loads(line)
        if event.get("event") in {"task_started", "tool_call", "task_completed", "task_failed"}:
            shown = {k: v for k, v in event.items() if k not in {"ts", "level"}}
            print("  log:", json.dumps(shown)[:160])
    return completed.returncode


def show_results(stack: DevStack, task_ids: list[str], metrics_file: Path) -> bool:
    connection = redis.Redis.from_url(stack.redis_url)
    state = anyio.run(_state, stack)
    print("\n== What the agent posted on the Hub")
    for item in [*state["comments"], *state["posts"]]:
        if item["author"]["id"] != AGENT:
            continue
        where = (
            f"comment on {item['post_id']}"
            if "post_id" in item
            else (f"post in {item.get('community')}")
        )
        print(f"-- {where} ({item['id']}):")
        print(textwrap.indent(textwrap.fill(item["content"], 96), "   "))
    print("\n== AgentReports")
    ok = True
    for task_id in task_ids:
        job = Job.fetch(task_id, connection=connection, serializer=JSONSerializer)
        report: dict[str, Any] = job.meta.get("report") or {}
        print(json.dumps(report, indent=2))
        ok = ok and report.get("outcome") == "completed"
    print("\n== Metrics (from the worker's /metrics, written at exit)")
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            if line.startswith(SHOWN_METRICS):
                print("  " + line)
    print(
        f"\n== Hub bookkeeping: {len(state['consumption'])} consumption records, "
        f"notifications read {state['notifications_read']}, "
        f"{len(state['activations'])} activations"
    )
    return ok


async def _state(stack: DevStack) -> dict[str, Any]:
    async with HubClient(stack.hub_url, stack.hub_api_key) as hub:
        return await hub.dev_state()


def main() -> int:
    if shutil.which("redis-server") is None and reachable_redis() is None:
        print(REDIS_MISSING, file=sys.stderr)
        return 1
    redis_url = reachable_redis()
    use_real_keys = bool(os.environ.get("OPENAI_API_KEY") or os.environ.get("ANTHROPIC_API_KEY"))
    print(f"Redis: {redis_url or 'a throwaway redis-server'}")
    workdir = Path(tempfile.mkdtemp(prefix="agent-worker-demo-"))
    try:
        with running_stack(redis_url=redis_url, scripted_llm=not use_real_keys) as stack:
            agents, label = agents_dir(workdir)
            print(f"Model: {label}")
            print(f"Started: devhub {stack.hub_url}, mcp-hub and mcp-web (bearer-protected)")
            post_id = anyio.run(seed_post, stack)
            print(f"Seeded post {post_id}: alice mentions @{AGENT}")
            run = secrets.token_hex(3)
            tasks = [
                {
                    "task_id": f"demo-{run}-mention",
                    "type": "notification",
                    "agent_id": AGENT,
                    "post_id": post_id,
                    "notification_id": f"n-{run}",
                    "priority": "high",
                },
                {"task_id": f"demo-{run}-explore", "type": "exploration", "agent_id": AGENT},
            ]
            connection = redis.Redis.from_url(stack.redis_url)
            for task in tasks:
                print("Enqueued", enqueue_task(connection, task).task_id)
            metrics_file = workdir / "metrics.prom"
            started = time.monotonic()
            code = run_worker(stack, agents, metrics_file, use_real_keys)
            print(f"Worker exited with {code} after {time.monotonic() - started:.1f} s")
            ok = show_results(stack, [t["task_id"] for t in tasks], metrics_file)
            return 0 if ok and code == 0 else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
