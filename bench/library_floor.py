"""The floor under a task's CPU: the calls a 3-step task must make, each made alone.

A concurrent worker's 3-step notification costs about 45 to 55 ms of CPU on a 2-core
machine (``python -m bench connections``). Much of it is spent in the libraries behind
the calls the task cannot do without: model calls through the openai SDK, Hub and MCP
requests over httpx2, Redis round trips through redis-py. ``CALLS_PER_TASK`` holds how
many of each a task makes (counted in docs/connections.md, "The floor under a task's
CPU"). Here each call is made alone, warm, one after another on one thread against the
real stack, with nothing of the worker around it. The thread's CPU (``RUSAGE_THREAD``)
per call, times the count per task, is a floor: no arrangement of threads and event
loops brings a task under it while the task makes those calls with those libraries.
"""

from __future__ import annotations

import resource
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import openai
import redis
from openai.types.chat import ChatCompletion

from bench._report import Table
from bench._size import Size
from bench._stack import BENCH_AGENT, bench_stack
from hub_client import HubClient

# Per 3-step notification in `bench connections`: model calls, Hub requests, MCP requests
# (tool calls on the shared session) and Redis round trips (a pipeline is one).
CALLS_PER_TASK = {"model": 2.9, "hub": 5.9, "mcp": 1.95, "redis": 54.5}
_CALLS = {
    "model": ("model call", "openai SDK post, as OpenAIModel sends it"),
    "hub": ("Hub request", "HubClient over httpx2 (budget health)"),
    "mcp": ("MCP request, at least", "httpx2 alone, the same GET (the MCP SDK adds to it)"),
    "redis": ("Redis round trip", "redis-py (HSET)"),
}
_SCENARIO = "library-floor"


def benchmark(*, size: Size) -> list[Table]:
    calls = size.pick(full=2000, quick=400, smoke=20)
    table = Table(
        "library floor: each call alone, warm, and what a 3-step task's calls add up to",
        ["call", "library", "CPU µs per call", "calls per task", "CPU ms per task"],
    )
    with bench_stack() as bench:
        stack = bench.stack
        assert stack.llm_base_url is not None
        _script_model(stack.llm_base_url, calls + 1)
        micros = {
            "model": anyio.run(_model_call_us, stack.llm_base_url, calls),
            "hub": anyio.run(_hub_request_us, stack.hub_url, stack.hub_api_key, calls),
            "mcp": anyio.run(_plain_request_us, stack.hub_url, stack.hub_api_key, calls),
            "redis": _redis_round_trip_us(bench.redis, calls * 5),
        }
    total = 0.0
    for kind, (name, library) in _CALLS.items():
        per_task = micros[kind] * CALLS_PER_TASK[kind] / 1000
        total += per_task
        table.add(name, library, f"{micros[kind]:.0f}", CALLS_PER_TASK[kind], f"{per_task:.1f}")
    table.add("floor", "", "", "", f"{total:.1f}")
    table.notes = [
        "CPU: the calling thread's user + system time (RUSAGE_THREAD) over the calls, after",
        "  one warm-up call; keep-alive connections, plain HTTP on loopback, the real stack",
        "  (scripted model endpoint, devhub, redis-server) in processes of its own.",
        "Calls per task: counted in a 200-task window of `bench connections` (see the module).",
    ]
    return [table]


def _thread_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


async def _cpu_us_per_call(call: Callable[[], Awaitable[object]], n: int) -> float:
    await call()  # warm: the connection open, the code paths loaded
    start = _thread_cpu_s()
    for _ in range(n):
        await call()
    return (_thread_cpu_s() - start) * 1e6 / n


def _script_model(llm_url: str, turns: int) -> None:
    answer = {"text": "A short answer.", "usage": {"input_tokens": 900, "output_tokens": 40}}
    body = {"name": _SCENARIO, "turns": [answer] * turns}
    httpx2.post(f"{llm_url}/_scripted/scenarios", json=body).raise_for_status()


async def _model_call_us(llm_url: str, n: int) -> float:
    body = {
        "model": _SCENARIO,
        "messages": [
            {"role": "system", "content": "You are a helpful agent. " * 40},
            {"role": "user", "content": "A notification: someone mentioned you. " * 10},
        ],
        "max_tokens": 1024,
    }
    options: Any = {"timeout": 30.0, "security": {"bearer_auth": True}}
    async with openai.AsyncOpenAI(base_url=f"{llm_url}/v1", api_key="sk-bench") as client:
        return await _cpu_us_per_call(
            lambda: client.post(
                "/chat/completions", body=body, cast_to=ChatCompletion, options=options
            ),
            n,
        )


async def _hub_request_us(hub_url: str, api_key: str, n: int) -> float:
    hub = HubClient(hub_url, api_key)
    try:
        return await _cpu_us_per_call(lambda: hub.budget_health(BENCH_AGENT), n)
    finally:
        await hub.aclose()


async def _plain_request_us(hub_url: str, api_key: str, n: int) -> float:
    headers = {"Authorization": f"Bearer {api_key}"}
    params = {"agent_id": BENCH_AGENT}
    async with httpx2.AsyncClient(base_url=hub_url, headers=headers) as client:
        return await _cpu_us_per_call(
            lambda: client.get("/api/v1/system/budget-health", params=params), n
        )


def _redis_round_trip_us(connection: redis.Redis, n: int) -> float:
    connection.hset("library-floor", "field", 0)
    start = _thread_cpu_s()
    for i in range(n):
        connection.hset("library-floor", "field", i)
    return (_thread_cpu_s() - start) * 1e6 / n
