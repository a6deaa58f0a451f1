"""How much of an agent fleet's input the providers' prompt caches serve, and what it costs.

A real ``rq worker --burst`` (the worker's own request path: the anthropic and openai SDKs)
runs a fleet's tasks against the dev stack (devhub, mcp-hub, mcp-web: two MCP servers'
tools) and the scripted model endpoint. Between the worker and the endpoint sits a proxy
that applies each provider's published caching rules (``bench._cache_rules``) to every
request the SDK sent and answers with the usage the real API would report
(Anthropic's ``cache_read_input_tokens`` / ``cache_creation_input_tokens``, OpenAI's
``prompt_tokens_details.cached_tokens``), so the worker's own accounting reads it.

The fleet: agents whose prompt and two skills are the size of public Botburrow definitions
(a few thousand tokens), each given tens of notification tasks of one to six steps (a
reply after up to five hub reads), arriving a few minutes apart per agent. The clock the
caches see is the workload's: a task starts at its arrival time and its steps are
``STEP_S`` apart, whatever the wall time of this host.

Each provider's workload runs twice, with ``PROMPT_CACHE=off`` (today's request shape:
one system text, nothing marked, no key) and with the cache engaged.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import redis
import yaml
from rq.job import Job
from rq.serializers import JSONSerializer

from bench._cache_rules import AnthropicCache, AnthropicUsage, CacheRuleError, OpenAICache
from bench._report import Table
from bench._size import Size
from bench._stack import REPO_ROOT, RQ, WORKER_RUN_TIMEOUT_S
from hub_client import HubClient
from worker.dev.devstack import DevStack, running_stack
from worker.dev.post_proxy import forward_post, post_proxy
from worker.enqueue import enqueue_task

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o-mini"}
ANTHROPIC_MINIMUM_TOKENS = 1024  # Sonnet 4.5's published minimum
# Sonnet 4.5, USD per million input tokens: base, cache read, 5-minute write, 1-hour write.
PRICE_INPUT, PRICE_READ, PRICE_WRITE_5M, PRICE_WRITE_1H = 3.0, 0.30, 3.75, 6.0
STEP_S = 6.0  # between two model calls of one task
MEAN_ARRIVAL_S = 150.0  # between two tasks of one agent
SPARSE_ARRIVAL_S = 900.0  # the same for agents seldom asked: the 1-hour TTL's case
PROMPT_CHARS = (4_000, 9_000)  # an agent's system prompt, smallest and largest
SKILL_CHARS = (1_500, 4_000)
_SCENARIO = re.compile(r"\[\[scenario:([A-Za-z0-9_.:-]+)\]\]")
_WORDS = (
    "review",
    "thread",
    "answer",
    "reply",
    "community",
    "post",
    "comment",
    "release",
    "worker",
    "queue",
    "scope",
    "grant",
    "tool",
    "search",
    "summary",
    "question",
    "context",
    "careful",
    "concise",
    "source",
    "link",
    "cite",
    "error",
    "retry",
    "policy",
    "owner",
    "team",
    "schedule",
    "deploy",
    "metric",
    "budget",
    "token",
    "model",
    "agent",
    "skill",
    "format",
)


@dataclass
class Tally:
    """What the proxy billed, by the provider's rules, over one run."""

    requests: int = 0
    prompt_tokens: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    keyed: int = 0  # OpenAI requests that carried prompt_cache_key
    refused: list[str] = field(default_factory=list)

    def input_usd(self) -> float:
        uncached = self.prompt_tokens - self.cache_read - self.cache_write_5m - self.cache_write_1h
        return (
            uncached * PRICE_INPUT
            + self.cache_read * PRICE_READ
            + self.cache_write_5m * PRICE_WRITE_5M
            + self.cache_write_1h * PRICE_WRITE_1H
        ) / 1e6


@dataclass
class CachingProxy:
    """Applies one provider's cache rules to each request and rewrites the answer's usage."""

    upstream: str  # the scripted endpoint's root
    starts: dict[str, float]  # task id -> its arrival on the workload's clock
    anthropic: AnthropicCache = field(
        default_factory=lambda: AnthropicCache(ANTHROPIC_MINIMUM_TOKENS)
    )
    openai: OpenAICache = field(default_factory=OpenAICache)
    tally: Tally = field(default_factory=Tally)
    _steps: dict[str, int] = field(default_factory=dict)
    _clock: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self, body: dict[str, Any]) -> float:
        """The workload's time of this request: its task's arrival plus its steps so far."""
        found = _SCENARIO.search(json.dumps(body))
        task = found.group(1) if found else ""
        step = self._steps.get(task, 0)
        self._steps[task] = step + 1
        self._clock = max(self._clock, self.starts.get(task, self._clock) + step * STEP_S)
        return self._clock

    def exchange(self, path: str, raw: bytes) -> tuple[int, bytes]:
        body = json.loads(raw)
        with self._lock:
            now = self.now(body)
            try:
                if path.endswith("/messages"):
                    usage: AnthropicUsage | tuple[int, int] = self.anthropic.request(body, now)
                else:
                    usage = self.openai.request(body, now)
                    self.tally.keyed += "prompt_cache_key" in body
            except CacheRuleError as error:
                self.tally.refused.append(str(error))
                answer = {"type": "error", "error": {"type": "invalid_request_error"}}
                return 400, json.dumps(answer | {"message": str(error)}).encode()
        status, payload = forward_post(self.upstream + path, raw, 60.0)
        if status != 200:
            return status, payload
        answer = json.loads(payload)
        with self._lock:
            self.tally.requests += 1
            if isinstance(usage, AnthropicUsage):
                answer["usage"] = usage.wire(answer["usage"]["output_tokens"])
                self.tally.prompt_tokens += usage.total
                self.tally.cache_read += usage.cache_read
                self.tally.cache_write_5m += usage.cache_write_5m
                self.tally.cache_write_1h += usage.cache_write_1h
            else:
                prompt_tokens, cached = usage
                completion = answer["usage"]["completion_tokens"]
                answer["usage"] = OpenAICache.wire(prompt_tokens, cached, completion)
                self.tally.prompt_tokens += prompt_tokens
                self.tally.cache_read += cached
        return 200, json.dumps(answer).encode()


# -- the fleet ---------------------------------------------------------------------------------


def _prose(rng: random.Random, chars: int, opening: str) -> str:
    """Deterministic instruction-like text of about ``chars`` characters."""
    sentences = [opening]
    while sum(len(s) + 1 for s in sentences) < chars:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 16))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def write_fleet(directory: Path, provider: str, agents: int, ttl: str = "5m") -> list[str]:
    """An AGENTS_DIR with ``agents`` agents of ``provider``, each with a prompt and two skills."""
    rng = random.Random(39)
    names = []
    for n in range(agents):
        name = f"{provider}-agent-{n}"
        skills = [f"{name}-style", f"{name}-triage"]
        config = {
            "name": name,
            "type": "native",
            "brain": {
                "provider": provider,
                "model": MODELS[provider],
                "max_tokens": 500,
                "prompt_cache_ttl": ttl,
            },
            "capabilities": {
                "grants": ["hub:read", "hub:write"],
                "mcp_servers": ["hub", "web"],
                "skills": skills,
            },
            "behavior": {
                "max_iterations": 8,
                "limits": {
                    "max_daily_posts": 100_000,
                    "max_daily_comments": 100_000,
                    "max_responses_per_thread": 100_000,
                    "min_interval_seconds": 0,
                },
            },
            "limits": {"max_tokens": 400_000, "max_duration_s": 120},
        }
        folder = directory / "agents" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        prompt = _prose(rng, rng.randint(*PROMPT_CHARS), f"You are {name} on the Hub.")
        (folder / "system-prompt.md").write_text(prompt + "\n")
        for skill in skills:
            skill_dir = directory / "skills" / skill
            skill_dir.mkdir(parents=True)
            text = _prose(rng, rng.randint(*SKILL_CHARS), f"How {name} works: {skill}.")
            (skill_dir / "SKILL.md").write_text(
                f"---\nname: {skill}\ndescription: {skill} for {name}.\n---\n\n{text}\n"
            )
        names.append(name)
    return names


@dataclass(frozen=True)
class FleetTask:
    task: dict[str, Any]
    start: float  # arrival on the workload's clock
    steps: int


def _turns(task_id: str, post_id: str, steps: int, rng: random.Random) -> list[dict[str, Any]]:
    reads = [
        {"name": "hub__get_thread", "arguments": {"post_id": post_id}},
        {"name": "hub__search_posts", "arguments": {"query": task_id}},
    ]
    turns: list[dict[str, Any]] = [
        {"tool_calls": [rng.choice(reads)], "usage": {"input_tokens": 1, "output_tokens": 60}}
        for _ in range(steps - 1)
    ]
    turns.append(
        {
            "text": f"Here is what I found for {task_id}.",
            "usage": {"input_tokens": 1, "output_tokens": 80},
        }
    )
    return turns


async def _seed(
    stack: DevStack, agents: list[str], tasks_per_agent: int, run: str, arrival_s: float
) -> list[FleetTask]:
    rng = random.Random(42)
    seeded: list[FleetTask] = []
    assert stack.llm_base_url is not None
    async with (
        HubClient(stack.hub_url, stack.hub_api_key) as hub,
        httpx2.AsyncClient(base_url=stack.llm_base_url, timeout=10.0) as llm,
    ):
        for agent in agents:
            clock = rng.uniform(0, arrival_s)
            for n in range(tasks_per_agent):
                task_id = f"{run}-{agent}-{n}"
                steps = rng.randint(1, 6)
                post = await hub.create_post(
                    agent_id="alice",
                    title=f"Question {n} for {agent}",
                    content=f"@{agent} can you look into this for us? [[scenario:{task_id}]]",
                    community="m/general",
                    idempotency_key=f"{task_id}:seed",
                )
                turns = _turns(task_id, post.id, steps, rng)
                answer = await llm.post(
                    "/_scripted/scenarios", json={"name": task_id, "turns": turns}
                )
                answer.raise_for_status()
                task = {
                    "task_id": task_id,
                    "type": "notification",
                    "agent_id": agent,
                    "post_id": post.id,
                    "notification_id": f"n-{task_id}",
                }
                seeded.append(FleetTask(task, clock, steps))
                clock += rng.expovariate(1 / arrival_s) + steps * STEP_S
    return sorted(seeded, key=lambda item: item.start)


@dataclass
class RunResult:
    tasks: int
    tally: Tally
    reported_input: int  # the worker's AgentReports, summed
    reported_read: int
    reported_write: int
    reported_cost_usd: float
    outcomes: dict[str, int]


def run_fleet(
    provider: str,
    *,
    agents: int,
    tasks_per_agent: int,
    cache: str,
    arrival_s: float = MEAN_ARRIVAL_S,
    ttl: str = "5m",
) -> RunResult:
    """One provider's workload through a real burst worker, ``PROMPT_CACHE=cache``; an
    agent's tasks ``arrival_s`` apart on average, its prompt kept for ``ttl``."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-cache-") as workdir,
        running_stack(scripted_llm=True) as stack,
    ):
        assert stack.llm_base_url is not None
        names = write_fleet(Path(workdir), provider, agents, ttl)
        run = f"pc{provider[0]}{cache}{ttl}"
        fleet = anyio.run(_seed, stack, names, tasks_per_agent, run, arrival_s)
        proxy = CachingProxy(stack.llm_base_url, {t.task["task_id"]: t.start for t in fleet})
        connection = redis.Redis.from_url(stack.redis_url)
        try:
            for item in fleet:
                enqueue_task(connection, item.task)
            with post_proxy(proxy.exchange) as url:
                env = stack.worker_env(
                    AGENTS_DIR=workdir,
                    METRICS_PORT="0",
                    PYTHONPATH=str(REPO_ROOT),
                    PROMPT_CACHE=cache,
                    OPENAI_BASE_URL=url + "/v1",
                    ANTHROPIC_BASE_URL=url,
                )
                subprocess.run(
                    [RQ, "worker", "agents", "--burst"],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=WORKER_RUN_TIMEOUT_S * 4,
                    check=True,
                )
            reports = [_report(connection, item.task["task_id"]) for item in fleet]
        finally:
            connection.close()
    outcomes: dict[str, int] = {}
    for report in reports:
        outcome = str(report.get("outcome", "no report"))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return RunResult(
        tasks=len(fleet),
        tally=proxy.tally,
        reported_input=sum(int(r.get("tokens_input", 0)) for r in reports),
        reported_read=sum(int(r.get("tokens_cache_read", 0)) for r in reports),
        reported_write=sum(int(r.get("tokens_cache_write", 0)) for r in reports),
        reported_cost_usd=sum(float(r.get("cost_usd") or 0.0) for r in reports),
        outcomes=outcomes,
    )


def _report(connection: redis.Redis, task_id: str) -> dict[str, Any]:
    job = Job.fetch(task_id, connection=connection, serializer=JSONSerializer)
    report = job.meta.get("report")
    return report if isinstance(report, dict) else {}


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    agents, tasks = size.pick(full=(4, 20), quick=(3, 8), smoke=(2, 2))
    table = Table(
        f"Prompt cache: {agents} agents x {tasks} tasks of 1-6 steps each, per provider "
        "(the providers' published rules; input $ at Sonnet 4.5 prices)",
        [
            "provider",
            "request shape",
            "model calls",
            "input tokens",
            "read from cache",
            "written",
            "input $/task",
            "vs cache off",
            "worker's report: read / written / $ per task",
            "outcomes",
        ],
    )
    for provider in ("anthropic", "openai"):
        off_usd = 0.0
        for cache in ("off", "on"):
            result = run_fleet(provider, agents=agents, tasks_per_agent=tasks, cache=cache)
            tally = result.tally
            share = tally.cache_read / max(1, tally.prompt_tokens)
            written = (tally.cache_write_5m + tally.cache_write_1h) / max(1, tally.prompt_tokens)
            per_task = tally.input_usd() / max(1, result.tasks)
            off_usd = per_task if cache == "off" else off_usd
            shape = "cache off (today)" if cache == "off" else "cache on"
            if provider == "openai":
                shape += f", key on {tally.keyed}/{tally.requests}"
            reported = (
                f"{result.reported_read / max(1, result.reported_input):.1%} / "
                f"{result.reported_write / max(1, result.reported_input):.1%} / "
                f"{result.reported_cost_usd / max(1, result.tasks):.4f}"
            )
            table.add(
                provider,
                shape,
                tally.requests,
                tally.prompt_tokens,
                f"{share:.1%}",
                f"{written:.1%}",
                f"{per_task:.4f}",
                f"{per_task / off_usd:.0%}" if off_usd else "-",
                reported,
                ", ".join(f"{k} {v}" for k, v in sorted(result.outcomes.items())),
            )
            if tally.refused:
                table.notes.append(f"{provider} {cache}: refused {tally.refused[:3]}")
    table.notes += [
        f"clock: a task's steps {STEP_S:g} s apart, an agent's tasks {MEAN_ARRIVAL_S:g} s apart "
        "on average (exponential); tokens: 4 characters each",
        "input $ for OpenAI-style rows priced as if Sonnet 4.5 billed them (cached at 0.1x)",
        "worker's report: what the AgentReports say (tokens_cache_read, tokens_cache_write "
        "of tokens_input; cost_usd includes output tokens)",
    ]
    return [table, ttl_table(agents, tasks)]


def ttl_table(agents: int, tasks: int) -> Table:
    """Anthropic agents whose tasks come further apart than 5 minutes: the 1-hour TTL."""
    table = Table(
        f"Prompt cache TTL: {agents} Anthropic agents x {tasks} tasks, an agent's tasks "
        f"{SPARSE_ARRIVAL_S / 60:g} minutes apart on average",
        ["brain.prompt_cache_ttl", "read from cache", "written 5m", "written 1h", "input $/task"],
    )
    for ttl in ("5m", "1h"):
        result = run_fleet(
            "anthropic",
            agents=agents,
            tasks_per_agent=tasks,
            cache="on",
            arrival_s=SPARSE_ARRIVAL_S,
            ttl=ttl,
        )
        tally = result.tally
        total = max(1, tally.prompt_tokens)
        table.add(
            ttl,
            f"{tally.cache_read / total:.1%}",
            f"{tally.cache_write_5m / total:.1%}",
            f"{tally.cache_write_1h / total:.1%}",
            f"{tally.input_usd() / max(1, result.tasks):.4f}",
        )
    table.notes.append(
        "the agent's tools, prompt and skills take the TTL; the conversation's marks keep 5 "
        "minutes (a task's steps are seconds apart)"
    )
    return table
