"""MCP per task: session set-up and per-call cost, HTTP against stdio, cold against warm.

``McpToolbox.open`` on a config holding our hub server, either over streamable
HTTP (a running ``python -m mcp_servers.hub``) or over stdio (``python -m
mcp_servers.hub --stdio`` with HUB_URL and HUB_API_KEY in the server's env),
started by each task's toolbox or, marked ``pool: true``, once per process and
shared by its tasks. HTTP and pooled servers run with the per-process tool-list
cache on (the default) and off (``tool_list_ttl_s=0``). Each sample is a fresh
process that first does what the worker parent does before it forks
(``preload``): its first session is what a job process pays ("cold"); the
sessions after it in the same process are "warm" (modules, schemas, pools and
pooled servers already used once), what a task pays under WORKER_CONCURRENCY > 1.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import anyio

from bench._report import Summary, Table
from bench._size import Size
from bench._stack import REPO_ROOT, BenchStack, bench_stack

SAMPLES = 5
WARM_SESSIONS = 5
CALLS_PER_SESSION = 10
PROBE_TIMEOUT_S = 180


@dataclass(frozen=True)
class Variant:
    """How the hub server is reached, and whether tool lists may come from the cache."""

    name: str
    transport: str
    pooled: bool = False
    cache: bool = True

    @property
    def cache_label(self) -> str:
        # A per-task stdio server is a new process every time: nothing to cache.
        if self.transport == "stdio" and not self.pooled:
            return "-"
        return "on" if self.cache else "off"


VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("http", "http"),
        Variant("http-nocache", "http", cache=False),
        Variant("stdio", "stdio"),
        Variant("stdio-pooled", "stdio", pooled=True),
        Variant("stdio-pooled-nocache", "stdio", pooled=True, cache=False),
    )
}


@dataclass(frozen=True)
class SessionTimes:
    """Milliseconds of one toolbox session: open (connect + list tools), calls, close."""

    open_ms: float
    first_call_ms: float
    later_call_ms: float
    close_ms: float


async def _session(config: Any, post_id: str, cache: bool) -> SessionTimes:
    from worker.tools import CallContext, EffectiveGrants, McpToolbox, fixed_capability

    grants = EffectiveGrants.of(["hub:read"])
    # Off: every session asks the server for its tools; on: the default time to live.
    cache_options: dict[str, Any] = {} if cache else {"tool_list_ttl_s": 0.0}
    started = time.perf_counter()
    async with McpToolbox.open(
        config,
        grants=grants,
        auth_token=_auth_token(),
        capability=fixed_capability(_capability(grants)),
        **cache_options,
    ) as toolbox:
        opened = time.perf_counter()
        if toolbox.unavailable_servers:
            raise RuntimeError(f"hub server unavailable: {toolbox.unavailable_servers}")
        call_ms = []
        for index in range(CALLS_PER_SESSION):
            ctx = CallContext(
                task_id="bench-mcp", agent_id="bench-agent", step=1, index=index, timeout_s=30.0
            )
            call_started = time.perf_counter()
            result = await toolbox.call("hub__get_thread", {"post_id": post_id}, ctx)
            call_ms.append((time.perf_counter() - call_started) * 1000)
            if result.is_error:
                raise RuntimeError(f"hub__get_thread failed: {result.content}")
        closing = time.perf_counter()
    return SessionTimes(
        open_ms=(opened - started) * 1000,
        first_call_ms=call_ms[0],
        later_call_ms=statistics.median(call_ms[1:]),
        close_ms=(time.perf_counter() - closing) * 1000,
    )


def _capability(grants: Any) -> str | None:
    """The capability a worker would mint for the bench's task (the devstack sets a key)."""
    from worker.settings import settings
    from worker.tools import TaskScope, mint_capability

    key = settings().capability_key
    if key is None:
        return None
    return mint_capability(
        key.get_secret_value(),
        agent_id="bench-agent",
        task_id="bench-mcp",
        grants=grants,
        expires_at=time.time() + 600,
        # Anywhere: these tests are about identity and grants, not the scope.
        scope=TaskScope(comment_on=None, post_in=None),
    )


def _auth_token() -> str | None:
    from worker.settings import settings

    token = settings().mcp_auth_token
    return token.get_secret_value() if token is not None else None


def _probe(variant: Variant, post_id: str, warm_sessions: int) -> list[SessionTimes]:
    """In a fresh process: preload as the worker parent does, then 1 + ``warm_sessions``."""
    from worker.models import PROVIDERS
    from worker.pipeline._runtime import mcp_config, preload
    from worker.settings import settings
    from worker.tools import McpConfig, close_stdio_pool
    from worker.tools._config import McpServerConfig

    preload(PROVIDERS)
    configured = mcp_config(settings().mcp_config)  # type: ignore[arg-type]
    hub = configured.servers["hub"]
    if variant.transport == "stdio":
        stack_env = settings()
        server = McpServerConfig.model_validate(
            {
                "command": sys.executable,
                "args": ["-m", "mcp_servers.hub", "--stdio"],
                "env": {
                    "HUB_URL": stack_env.hub_url,
                    "HUB_API_KEY": stack_env.hub_api_key.get_secret_value()
                    if stack_env.hub_api_key
                    else "",
                    "PYTHONPATH": str(REPO_ROOT),
                },
                "tools": dict(hub.tools),
                "pool": variant.pooled,
            }
        )
    else:
        server = hub
    config = McpConfig(servers={"hub": server})
    try:
        return [
            anyio.run(_session, config, post_id, variant.cache) for _ in range(1 + warm_sessions)
        ]
    finally:
        close_stdio_pool()


def _run_probe(
    bench: BenchStack, variant: Variant, post_id: str, warm_sessions: int
) -> list[SessionTimes]:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.mcp", "--probe", variant.name, post_id, str(warm_sessions)],
        cwd=REPO_ROOT,
        env=bench.worker_env(),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"mcp probe ({variant.name}) failed:\n{completed.stderr[-2000:]}")
    rows = json.loads(completed.stdout.strip().splitlines()[-1])
    return [SessionTimes(**row) for row in rows]


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    samples = size.pick(full=SAMPLES, quick=2, smoke=1)
    warm_sessions = size.pick(full=WARM_SESSIONS, quick=WARM_SESSIONS, smoke=1)
    results: dict[Variant, list[list[SessionTimes]]] = {v: [] for v in VARIANTS.values()}
    with bench_stack() as bench:
        post_id = bench.seed(1)[0]["post_id"]
        for _ in range(samples):
            for variant in results:
                results[variant].append(_run_probe(bench, variant, post_id, warm_sessions))
    table = Table(
        "MCP: one toolbox session (hub server), ms",
        [
            "transport",
            "tool cache",
            "state",
            "samples",
            "open median",
            "open min-max",
            "1st call",
            "later calls",
            "close",
            "open+close",
        ],
    )
    for variant, probes in results.items():
        for state in ("cold", "warm"):
            sessions = (
                [probe[0] for probe in probes]
                if state == "cold"
                else [session for probe in probes for session in probe[1:]]
            )
            table.add(
                "stdio pooled" if variant.pooled else variant.transport,
                variant.cache_label,
                state,
                len(sessions),
                *Summary.of([s.open_ms for s in sessions]).cells(1),
                f"{statistics.median(s.first_call_ms for s in sessions):.1f}",
                f"{statistics.median(s.later_call_ms for s in sessions):.1f}",
                f"{statistics.median(s.close_ms for s in sessions):.1f}",
                f"{statistics.median(s.open_ms + s.close_ms for s in sessions):.1f}",
            )
    table.notes = [
        "open: McpToolbox.open until the toolbox is usable (connect, protocol negotiation, list",
        "  tools unless cached; per-task stdio also starts the server process, pooled stdio only",
        "  for a process's first task). calls: hub__get_thread, which reads the devhub. close:",
        "  until the toolbox is closed (a per-task stdio server is stopped; a pooled one stays).",
        "  cold: a process's first session after the worker parent's preload, as a forked job",
        f"  process meets it; warm: the next {warm_sessions} sessions of that process, as tasks of",
        "  one process meet them with WORKER_CONCURRENCY > 1 (the goal for a pooled stdio",
        "  server: open+close <= 20 ms).",
    ]
    return [table]


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--probe" and sys.argv[2] in VARIANTS:
        sessions = _probe(VARIANTS[sys.argv[2]], sys.argv[3], int(sys.argv[4]))
        print(json.dumps([session.__dict__ for session in sessions]))
    else:
        names = "|".join(VARIANTS)
        print(f"usage: python -m bench.mcp --probe {names} POST_ID WARM_SESSIONS", file=sys.stderr)
        raise SystemExit(2)
