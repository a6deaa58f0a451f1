"""``make demo``: one notification and one exploration task, end to end, on a local stack.

Starts a throwaway redis-server, the devhub, our MCP servers and — unless
``DEMO_MODEL`` names a provider — a scripted model endpoint whose demo agent really
calls the hub tools; seeds a post that mentions the demo agent, enqueues the two tasks, runs
``rq worker agents --burst`` with ``RQ_WORKER_CLASS=worker.AgentWorker`` and
``RQ_CONFIG=worker.rq_config``, and
prints what the agent posted, the AgentReports and a few metric lines.

A real model is only ever chosen explicitly (``DEMO_MODEL=openai`` or ``anthropic``), never
by a provider key found in the shell: docs/first-agent.md leaves ``OPENAI_API_KEY`` and
``OPENAI_BASE_URL`` exported for its scripted endpoint, and a demo that took them as a
real provider would talk to the wrong endpoint. The banner prints the model's base URL.

It never touches a queue it did not create: ``REDIS_URL`` may point at a live
fleet, whose ``agents`` queue the demo's tasks must not join. Only on a host
without ``redis-server`` (or when ``DEMO_REDIS_URL`` names a Redis explicitly)
does it borrow that Redis, with a queue of its own (``demo-<random>``), and it
deletes afterwards every key of that queue, of its tasks and of ``demo-agent``.
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
from enum import StrEnum
from pathlib import Path
from typing import Any

import anyio
import redis
import yaml
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from hub_client import HubClient
from worker.dev.devstack import REDIS_MISSING, DevStack, free_port, running_stack
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


DEFAULT_QUEUE = "agents"
# Per-task limits of the demo agent (this worker's extension, added to its copy).
DEMO_LIMITS = {"max_tokens": 50_000, "max_duration_s": 120, "max_cost_usd": 0.05}
MODEL_VARIABLE = "DEMO_MODEL"


class DemoModel(StrEnum):
    """Which model the demo agent talks to (``DEMO_MODEL``)."""

    SCRIPTED = "scripted"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"

    @property
    def key_variable(self) -> str:
        return f"{self.value.upper()}_API_KEY"

    @property
    def base_url(self) -> str:
        """Where a real provider is reached: its ``*_BASE_URL``, else the SDK's default."""
        default = _SDK_BASE_URLS.get(self.value, "")
        return os.environ.get(f"{self.value.upper()}_BASE_URL") or default


# Where each provider's SDK goes without a *_BASE_URL.
_SDK_BASE_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


def chosen_model() -> DemoModel:
    """``DEMO_MODEL``, scripted when unset; exits with one line on a value or key missing."""
    value = os.environ.get(MODEL_VARIABLE, "").strip().lower() or DemoModel.SCRIPTED.value
    try:
        model = DemoModel(value)
    except ValueError:
        raise SystemExit(
            f"{MODEL_VARIABLE}={value!r}: expected scripted (the default), openai or anthropic"
        ) from None
    if model is not DemoModel.SCRIPTED and not os.environ.get(model.key_variable):
        raise SystemExit(f"{MODEL_VARIABLE}={model.value} needs {model.key_variable}")
    return model


def unused_keys_note(model: DemoModel) -> str | None:
    """A line for provider keys the shell holds that the scripted demo leaves alone."""
    if model is not DemoModel.SCRIPTED:
        return None
    held = [real for real in (DemoModel.OPENAI, DemoModel.ANTHROPIC)
            if os.environ.get(real.key_variable)]  # fmt: skip
    if not held:
        return None
    named = " and ".join(real.key_variable for real in held)
    return (
        f"Note: {named} set in this shell, not used: {MODEL_VARIABLE}="
        f"{held[0].value} runs the demo against {held[0].base_url}"
    )


def chosen_redis() -> tuple[str | None, str]:
    """(Redis URL or None for a throwaway redis-server, queue name); exits when neither works.

    A throwaway redis-server whenever one can be started. Without the binary, the Redis at
    DEMO_REDIS_URL, else at REDIS_URL, is borrowed under a queue of the demo's own.
    """
    explicit = os.environ.get("DEMO_REDIS_URL")
    if not explicit and shutil.which("redis-server") is not None:
        return None, DEFAULT_QUEUE
    variable = "DEMO_REDIS_URL" if explicit else "REDIS_URL"
    url = explicit or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        if not explicit:
            raise SystemExit(f"{REDIS_MISSING} (no Redis answers at REDIS_URL either)") from None
        raise SystemExit(f"{variable}: no Redis answers there ({type(exc).__name__})") from None
    return url, f"demo-{secrets.token_hex(4)}"


def forget_queue(connection: redis.Redis, queue_name: str, task_ids: list[str]) -> None:
    """Remove the demo's queue and every key its tasks and its agent left (jobs, results,
    checkpoints, the cached definition, write counters) from a borrowed Redis."""
    for fragment in [queue_name, *task_ids, AGENT]:
        keys = list(connection.scan_iter(match=f"*{fragment}*", count=1000))
        if keys:
            connection.delete(*keys)
    connection.srem(Queue.redis_queues_keys, Queue.redis_queue_namespace_prefix + queue_name)


def add_extensions(config: dict[str, Any]) -> None:
    """This worker's extensions of the demo agent, kept out of the shipped file (it stays in
    the public format): its per-task limits, and an exploration that posts its summary."""
    config["limits"] = dict(DEMO_LIMITS)
    discovery = config["behavior"]["discovery"]
    config["behavior"]["discovery"] = {**discovery, "post_final": True}


def agents_dir(workdir: Path, model: DemoModel) -> Path:
    """The demo agent, pointed at ``model``."""
    target = workdir / "agents"
    shutil.copytree(DEMO_AGENTS, target)
    config_path = target / "agents" / AGENT / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    add_extensions(config)
    if model is DemoModel.OPENAI:
        # A small model on a CPU (llama-server at OPENAI_BASE_URL) needs a window the
        # prompt is cut to, and more time than the demo's 120 s: the operator says so.
        window = os.environ.get("DEMO_MAX_CONTEXT_TOKENS")
        if window:
            config["brain"] = {**config["brain"], "max_context_tokens": int(window)}
        duration = os.environ.get("DEMO_MAX_DURATION_S")
        if duration:
            config["limits"] = {**config["limits"], "max_duration_s": int(duration)}
    elif model is DemoModel.ANTHROPIC:
        config["brain"] = {**config["brain"], "provider": "anthropic", "model": "claude-haiku-4-5"}
    else:
        # The scripted endpoint's built-in demo agent answers requests for model "demo".
        config["brain"] = {**config["brain"], "provider": "openai", "model": "demo"}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def model_banner(model: DemoModel, agents: Path, stack: DevStack) -> str:
    """What the demo agent talks to, and where."""
    brain = yaml.safe_load((agents / "agents" / AGENT / "config.yaml").read_text())["brain"]
    if model is DemoModel.SCRIPTED:
        return (
            f"Model: the built-in scripted demo model at {stack.llm_base_url}/v1 "
            f"({MODEL_VARIABLE}=openai or anthropic for a real one)"
        )
    return f"Model: {model.value} {brain['model']} at {model.base_url} ({MODEL_VARIABLE}={model})"


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


def worker_timeout_s() -> int:
    """Room for both tasks to take their whole max_duration_s, and the worker's start."""
    duration = int(os.environ.get("DEMO_MAX_DURATION_S") or 0)
    return max(WORKER_TIMEOUT_S, 2 * duration + 60)


def run_worker(
    stack: DevStack, agents: Path, metrics_file: Path, model: DemoModel, queue_name: str
) -> int:
    env = {
        **os.environ,
        **stack.worker_env(
            AGENTS_DIR=str(agents),
            METRICS_PORT=str(free_port()),
            METRICS_TEXTFILE=str(metrics_file),
        ),
    }
    if model is not DemoModel.SCRIPTED:  # keep the operator's real provider endpoint and key
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
    print(
        "$ RQ_WORKER_CLASS=worker.AgentWorker RQ_CONFIG=worker.rq_config "
        f"{rq.name} worker {queue_name} --burst"
    )
    completed = subprocess.run(
        [str(rq), "worker", queue_name, "--burst"],
        env=env,
        timeout=worker_timeout_s(),
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


def demo_tasks(post_id: str) -> list[dict[str, Any]]:
    run = secrets.token_hex(3)
    return [
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


def main() -> int:
    model = chosen_model()
    redis_url, queue_name = chosen_redis()
    print(f"Redis: {redis_url or 'a throwaway redis-server'}, queue {queue_name}")
    if (note := unused_keys_note(model)) is not None:
        print(note)
    workdir = Path(tempfile.mkdtemp(prefix="agent-worker-demo-"))
    task_ids: list[str] = []
    try:
        scripted = model is DemoModel.SCRIPTED
        with running_stack(redis_url=redis_url, scripted_llm=scripted) as stack:
            connection = redis.Redis.from_url(stack.redis_url)
            agents = agents_dir(workdir, model)
            print(model_banner(model, agents, stack))
            print(f"Started: devhub {stack.hub_url}, mcp-hub and mcp-web (bearer-protected)")
            post_id = anyio.run(seed_post, stack)
            print(f"Seeded post {post_id}: alice mentions @{AGENT}")
            tasks = demo_tasks(post_id)
            for task in tasks:
                task_ids.append(enqueue_task(connection, task, queue_name=queue_name).task_id)
                print("Enqueued", task_ids[-1])
            metrics_file = workdir / "metrics.prom"
            started = time.monotonic()
            code = run_worker(stack, agents, metrics_file, model, queue_name)
            print(f"Worker exited with {code} after {time.monotonic() - started:.1f} s")
            ok = show_results(stack, task_ids, metrics_file)
            if redis_url is not None:
                forget_queue(connection, queue_name, task_ids)
            return 0 if ok and code == 0 else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
