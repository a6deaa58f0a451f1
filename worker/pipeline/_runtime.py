"""TaskRuntime: what a task needs from its process, built from the environment and rq's job."""

from __future__ import annotations

import importlib
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from redis import Redis

from hub_client import HubClient
from worker._hooks import allow_every_tool
from worker._network import client_ssl_context
from worker._spawn import SpawnHook, ignore_spawn
from worker.agents import AgentDefinition, AgentStore, DefinitionPolicy
from worker.coordination import journal_tool_intents, read_task_deadline, running_in_process
from worker.logs import set_redactor
from worker.loop import CanExecuteTool
from worker.memory import MemoryStore
from worker.metrics import JobMetrics
from worker.models import (
    FleetLimiter,
    Model,
    PriceTable,
    PromptCache,
    RateLimits,
    agent_cache_key,
    create_model,
    load_price_table,
    warm_up_providers,
)
from worker.redaction import Redactor, process_redactor
from worker.redis_io import child_process_recorder, connect, job_attempt, patient_redis_retry
from worker.settings import Settings, settings
from worker.task import Task
from worker.tools import (
    CapabilitySource,
    EffectiveGrants,
    LocalToolbox,
    McpConfig,
    McpToolbox,
    ScopeCell,
    TaskScope,
    Toolbox,
    cached_grant_policy,
    load_can_execute_tool,
    load_mcp_config,
    mint_capability,
    no_capability,
)
from worker.tracing import configure_tracing

# Opens a task's tools; their calls carry a capability signed for the cell's scope.
ToolboxOpener = Callable[[AgentDefinition, Task, ScopeCell], AbstractAsyncContextManager[Toolbox]]
ModelMaker = Callable[[AgentDefinition], Model]


@dataclass(kw_only=True)
class TaskRuntime:
    """Everything a task needs from its process. Tests replace ``make_model``/``open_toolbox``."""

    settings: Settings
    redis: Redis
    agents: AgentStore
    metrics: JobMetrics
    redactor: Redactor
    make_model: ModelMaker
    open_toolbox: ToolboxOpener
    attempt: int = 0
    hub: HubClient | None = None
    on_spawn: SpawnHook = ignore_spawn
    # The rq job id, when running under rq: a job process's metrics go to its worker via Redis.
    job_id: str | None = None
    # rq kills the job at its timeout: the loop winds down before that (timeout - grace).
    deadline_cap_s: float | None = None
    # Prices cost budgets are planned with (PRICES_FILE over the built-in table).
    prices: PriceTable | None = None
    # The operator's CAN_EXECUTE_TOOL check, asked before every tool call of the native loop.
    can_execute_tool: CanExecuteTool = allow_every_tool
    # Where agent memories live; None: the Redis store on ``redis`` (worker.memory).
    memory_store: MemoryStore | None = None

    def flush_metrics(self) -> None:
        if self.job_id is None or running_in_process():  # no job process between
            self.metrics.apply_locally()
        else:
            self.metrics.flush(self.redis, self.job_id)


@lru_cache(maxsize=1)
def _redactor() -> Redactor:
    redactor = process_redactor(settings().secret_values())
    set_redactor(redactor)
    return redactor


@lru_cache(maxsize=1)
def _prices() -> PriceTable:
    return load_price_table(settings())


@lru_cache(maxsize=4)
def mcp_config(path: Path) -> McpConfig:
    """``MCP_CONFIG``, read once per process."""
    return load_mcp_config(path)


# Modules the HTTP stack and the provider SDKs import only on first use. Imported in the
# worker parent, they are not imported again by every job process (~100 ms per job).
_FIRST_USE_MODULES = (
    "anyio._backends._asyncio",  # anyio loads its backend at the first run()
    "anyio.streams.tls",
    "httpcore2",  # httpx2 loads its connection pool when it builds a transport
    "h11",
    "encodings.idna",  # host names are IDNA-encoded at the first request
    "encodings.utf_8_sig",  # looked up when the first JSON answer is decoded
)


def preload(providers: Collection[str]) -> None:
    """Parse configuration and load what every task uses, once in the worker parent,
    so every forked job inherits it instead of redoing it: the SDKs of ``providers``
    (those of the agents found at start; a provider's SDK is imported on first use)."""
    config = settings()
    _redactor()
    # Before tracing is on: the canned call would be a root ``chat warm-up`` span of its
    # own, a trace of a call that never reached a provider.
    warm_up_providers(providers)
    configure_tracing("agent-worker")  # forked job processes inherit the tracer provider
    _prices()
    cached_grant_policy(config.grant_policy)
    if config.mcp_config is not None:
        mcp_config(config.mcp_config)
    client_ssl_context()
    client_ssl_context(trust_env=False)
    for module in _FIRST_USE_MODULES:
        importlib.import_module(module)


def make_model(agent: AgentDefinition, config: Settings, redis: Redis) -> Model:
    """The agent's model. Its endpoint and key variable are the operator's to allow
    (checked at load, and again here: a cached definition may predate the rules); the
    worker's own key goes only to the operator's endpoint (``create_model``)."""
    brain = agent.config.brain
    where = f"agents/{agent.config.name}/config.yaml"
    api_key, base_url = DefinitionPolicy.from_settings(config).model_access(brain, where)
    limits = RateLimits(
        requests_per_minute=config.llm_requests_per_minute,
        tokens_per_minute=config.llm_tokens_per_minute,
    )
    return create_model(
        brain.provider,
        brain.model,
        api_key=api_key,
        base_url=base_url,
        temperature=brain.temperature,
        max_output_tokens=brain.max_tokens or 4096,
        fallbacks=[(fallback.provider, fallback.model) for fallback in brain.fallbacks],
        settings=config,
        prices=_prices(),
        rate_limiter=FleetLimiter(redis, brain.provider, brain.model, limits),
        prompt_cache=prompt_cache(agent, config),
    )


def prompt_cache(agent: AgentDefinition, config: Settings) -> PromptCache | None:
    """How the agent's model calls engage their provider's prompt cache (``PROMPT_CACHE``)."""
    if config.prompt_cache == "off":
        return None
    return PromptCache(
        key=agent_cache_key(agent.config.name),
        ttl=agent.config.brain.prompt_cache_ttl,
        send_key=config.openai_prompt_cache_routing,
    )


def effective_grants(config: Settings, agent: AgentDefinition) -> EffectiveGrants:
    """The agent's requested grants as GRANT_POLICY caps them (read once per process),
    strict under STRICT_GRANTS or the definition's ``behavior.strict_grants``."""
    policy = cached_grant_policy(config.grant_policy)
    grants = policy.effective_grants(agent.config.name, agent.config.capabilities.grants)
    return replace(grants, strict=config.strict_grants or agent.config.behavior.strict_grants)


def toolbox_opener(
    config: Settings,
    on_spawn: SpawnHook = ignore_spawn,
    deadline_cap_s: float | None = None,
    redis: Redis | None = None,
) -> ToolboxOpener:
    """Opens the task's McpToolbox: its effective grants, MCP_AUTH_TOKEN for first-party
    servers and, with CAPABILITY_KEY, a capability signed for this agent, task and the
    scope in ``scope`` that expires at the task's deadline (the one kept in ``redis``
    across re-runs, when given)."""

    @asynccontextmanager
    async def open_toolbox(
        agent: AgentDefinition, task: Task, scope: ScopeCell
    ) -> AsyncIterator[Toolbox]:
        if config.mcp_config is None:
            yield LocalToolbox([])  # no MCP_CONFIG: the agent answers without tools
            return
        grants = effective_grants(config, agent)
        token = config.mcp_auth_token.get_secret_value() if config.mcp_auth_token else None
        async with McpToolbox.open(
            mcp_config(config.mcp_config),
            grants=grants,
            allowed_tools=task.constraints.allowed_tools,
            servers=agent.config.capabilities.server_names or None,
            auth_token=token,
            capability=_capability(config, agent, task, grants, deadline_cap_s, redis, scope),
            max_result_bytes=config.mcp_result_max_bytes,
            on_spawn=on_spawn,
            share_sessions=True,
            concurrency=config.worker_concurrency,
        ) as toolbox:
            yield toolbox

    return open_toolbox


def _capability(
    config: Settings,
    agent: AgentDefinition,
    task: Task,
    grants: EffectiveGrants,
    deadline_cap_s: float | None,
    redis: Redis | None,
    scope: ScopeCell,
) -> CapabilitySource:
    """Signs the task's capability for the scope the cell holds at each call, once per
    scope: the pipeline sets the real one after it has read the task's thread or feed."""
    if config.capability_key is None:
        return no_capability
    durations = (
        agent.config.limits.max_duration_s,
        task.constraints.max_duration_s,
        deadline_cap_s,
    )
    # The toolbox opens as the loop starts: at the latest, now plus the task's time.
    expires_at = time.time() + min(d for d in durations if d is not None)
    # A re-run continues against the deadline its first run fixed: never a fresh duration.
    kept = read_task_deadline(redis, task.task_id) if redis is not None else None
    key = config.capability_key.get_secret_value()
    signed: dict[TaskScope, str] = {}

    def current() -> str:
        if scope.scope not in signed:
            signed[scope.scope] = mint_capability(
                key,
                agent_id=agent.config.name,
                task_id=task.task_id,
                grants=grants,
                expires_at=expires_at if kept is None else min(kept, expires_at),
                scope=scope.scope,
            )
        return signed[scope.scope]

    return current


def build_runtime(
    redis: Redis,
    *,
    job_id: str | None = None,
    attempt: int = 0,
    deadline_cap_s: float | None = None,
) -> TaskRuntime:
    config = settings()
    on_spawn = child_process_recorder(redis, job_id) if job_id else ignore_spawn
    return TaskRuntime(
        settings=config,
        redis=redis,
        agents=AgentStore(config.agents_dir, redis=redis, ttl_s=config.agent_cache_ttl_s),
        metrics=JobMetrics(),
        redactor=_redactor(),
        make_model=lambda agent: make_model(agent, config, redis),
        open_toolbox=toolbox_opener(config, on_spawn, deadline_cap_s, redis),
        attempt=attempt,
        on_spawn=on_spawn,
        job_id=job_id,
        deadline_cap_s=deadline_cap_s,
        prices=_prices(),
        can_execute_tool=(
            load_can_execute_tool(config.can_execute_tool)
            if config.can_execute_tool
            else allow_every_tool
        ),
    )


def runtime_for_job(job: Any) -> TaskRuntime:
    """The runtime for the current rq job (or for a direct call outside rq).

    Every tool call journals its intent before it runs (``worker.tools._idempotency``),
    and the connection waits out Redis outages and refused writes like the worker's.
    """
    if job is None:
        config = settings()
        redis = connect(config)
        redis.set_retry(patient_redis_retry(config.redis_patience_s))
        runtime = build_runtime(redis)
    else:
        # The worker vetted meta.attempt before the fork; this names the problem otherwise.
        attempt = job_attempt(job.meta)
        cap = job.timeout - settings().job_timeout_grace_s if job.timeout else None
        runtime = build_runtime(job.connection, job_id=job.id, attempt=attempt, deadline_cap_s=cap)
    runtime.open_toolbox = journal_tool_intents(runtime.open_toolbox, runtime.redis)
    return runtime
