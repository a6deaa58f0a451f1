"""The metric families the worker exports: names, help, labels, buckets (a contract).

docs/reference/metrics.md lists these names and labels (written from these tables); dashboards
and alerts in deploy/ read them. ``worker.metrics`` builds its metric objects
from these tables and accepts nothing outside them from a job process.
"""

from __future__ import annotations

from worker.hub_writes import DEAD_LETTER_KINDS
from worker.redis_io import OUTAGE_KINDS

# name -> (help, label names); the names and labels the reference lists are a contract.
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "agent_tasks_total": (
        "Tasks finished, by agent, task type and outcome.",
        ("agent", "type", "outcome"),
    ),
    "agent_llm_calls_total": (
        "LLM calls, by provider, model and status.",
        ("provider", "model", "status"),
    ),
    "agent_llm_tokens_total": (
        "LLM tokens, by model and direction: input (every input token), output, and of the "
        "input, cache_read and cache_write (read from and written to the provider's prompt "
        "cache).",
        ("model", "direction"),
    ),
    "agent_cost_usd_total": (
        "LLM cost in US dollars of tasks with known prices, by agent.",
        ("agent",),
    ),
    "agent_tool_calls_total": (
        "Tool calls, by MCP server, tool and outcome.",
        ("server", "tool", "outcome"),
    ),
    "agent_grant_denials_total": (
        "Tool calls refused for a missing grant, by agent and tool.",
        ("agent", "tool"),
    ),
    "agent_errors_posted_total": ("Failed tasks posted to m/agent-errors.", ()),
    # Failures before our code runs (trap 15): counted by the worker parent itself.
    "agent_jobs_undecodable_total": (
        "rq jobs whose data could not be decoded; failed without running.",
        (),
    ),
    # Lost connections and refused writes (OOM, READONLY, LOADING) alike: both are waited out.
    "agent_redis_unavailable_total": (
        "Waits of the worker for a Redis that was unreachable or refused writes, by kind.",
        ("kind",),
    ),
    "agent_outbox_dead_letters_total": (
        "Hub writes given up (refused by the Hub, or out of attempts), by kind.",
        ("kind",),
    ),
    "agent_hub_writes_refused_total": (
        "Hub writes the worker refused for an agent's write caps, by agent, kind and reason.",
        ("agent", "kind", "reason"),
    ),
    "agent_scope_refusals_total": (
        "Writes refused for being outside their task's scope (injection attempts, most "
        "often), by agent and tool.",
        ("agent", "tool"),
    ),
    "agent_egress_refusals_total": (
        "Reads a private task held back because they would carry data where no trusted "
        "input points (a fetch URL, a third-party tool without a rule), by agent and tool.",
        ("agent", "tool"),
    ),
    "agent_budget_check_unreachable_total": (
        "Budget checks the Hub did not answer, by agent (BUDGET_UNREACHABLE says what follows).",
        ("agent",),
    ),
    "agent_memory_recalls_total": (
        "Memory recalls at context build, by agent and the strategy used.",
        ("agent", "strategy"),
    ),
    "agent_memory_recall_hits_total": (
        "Memories placed in task prompts by recall, by agent.",
        ("agent",),
    ),
    "agent_memory_writes_total": (
        "Memories written after tasks, by agent and kind.",
        ("agent", "kind"),
    ),
    "agent_memory_evictions_total": (
        "Memories evicted (oldest first) to keep an agent within memory.max_size_mb, by agent.",
        ("agent",),
    ),
}
# name -> (help, label names, buckets)
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "agent_task_duration_seconds": (
        "Wall-clock duration of tasks, by task type.",
        ("type",),
        (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    ),
    "agent_loop_iterations": (
        "Loop iterations per task, by task type.",
        ("type",),
        (1, 2, 3, 5, 8, 10, 15, 20, 30, 50),
    ),
    "agent_tool_call_duration_seconds": (
        "Duration of tool calls, by MCP server.",
        ("server",),
        (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    ),
    "agent_memory_recall_duration_seconds": (
        "Time a task's memory recall took (Redis reads, ranking, embeddings call).",
        (),
        (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
    ),
}
UNDECODABLE_JOBS = "agent_jobs_undecodable_total"
# name -> (help, label names) of what ``agent-worker pool`` adds to the host's /metrics, read
# from the pool itself at scrape time (worker.daemon.pool._supervisor).
POOL_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "agent_pool_workers": ("Workers of agent-worker pool, by state.", ("state",)),
}
POOL_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "agent_pool_worker_restarts_total": (
        "Workers agent-worker pool started again after one ended.",
        (),
    ),
}
# name -> (help, label names) of the gauges read from Redis at each scrape (worker.metrics
# ._collector): every worker exports the same values, so dashboards take ``max``.
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "agent_queue_jobs": (
        "Jobs per rq queue and state, read from Redis at scrape time (same on every worker).",
        ("queue", "state"),
    ),
    "agent_outbox_items": (
        "Hub calls waiting in the outbox for a retry, read from Redis at scrape time.",
        (),
    ),
    "agent_memory_bytes": (
        "Bytes of each agent's memory (records and embeddings), read from Redis at scrape time.",
        ("agent",),
    ),
}
# Distinct values a label fed by names from outside may take in one worker (a backstop:
# the job side already maps made-up tools and invalid tasks to one value); later ones
# are counted as "other", so no input can grow the series without bound.
LABEL_VALUE_CAPS = {"tool": 256, "agent": 1024, "model": 128}
OTHER_LABEL = "other"
# Counters whose every label value is known in advance: started at 0 (the alerts in
# deploy/prometheus count their first event with increase()).
KNOWN_LABEL_SETS: dict[str, list[tuple[str, ...]]] = {
    "agent_redis_unavailable_total": [(kind,) for kind in OUTAGE_KINDS],
    "agent_outbox_dead_letters_total": [(kind,) for kind in DEAD_LETTER_KINDS],
}
