"""The execution request of a task: what the model reads first, and how the run is bounded.

thread (notification) or feed (discovery) → redacted whole → system prompt and first
message (``_prompt`` writes their text, clipping long items) → loop settings →
ExecutionRequest.

The Hub's texts are redacted as they arrive, before anything clips them: the prompt's
item clip, memory's message clip and recall's query all cut, and a redactor handed half
a secret cannot recognise it (redact, then cut).
"""

from __future__ import annotations

from dataclasses import replace

from hub_client import BudgetHealth, HubClient, HubError, HubNotFound, Post
from worker.agents import AgentDefinition
from worker.coordination import RedisControl, RedisJournal
from worker.exceptions import InvalidTask
from worker.executors import ExecutionRequest
from worker.logs import log_event
from worker.loop import LoopSettings, RunLimits, dearest_price, redacting_arguments
from worker.models import Message, ModelBoundary, ModelPrice, PriceTable, UntrustedBlocks
from worker.pipeline import _discovery, _memory, _prompt
from worker.pipeline._call_rules import TaskCallRules, checking_replies
from worker.pipeline._early_tools import ToolboxFactory
from worker.pipeline._observers import metrics_observer
from worker.pipeline._runtime import TaskRuntime, effective_grants, mcp_config
from worker.pipeline._scope import EgressPolicy, task_scope, with_private_memory
from worker.pipeline._state import RunState
from worker.pipeline._writes import refusal_handler, scope_refusal_handler, scoped_toolbox
from worker.task import Task, TaskType
from worker.tools import TaskScope

# How many posts a discovery task reads, and how long it waits for them.
_FEED_LIMIT = 20
_FEED_TIMEOUT_S = 10.0


def task_toolbox(
    runtime: TaskRuntime, state: RunState, task: Task, agent: AgentDefinition
) -> ToolboxFactory:
    """Opens the agent's tools for this task: writes kept within its scope and counted
    against its write caps, known secrets masked in the arguments of every call."""
    return redacting_arguments(
        lambda: scoped_toolbox(runtime, state, task, agent), runtime.redactor
    )


async def build_request(
    runtime: TaskRuntime,
    hub: HubClient,
    state: RunState,
    *,
    task: Task,
    agent: AgentDefinition,
    budget: BudgetHealth | None,
    open_toolbox: ToolboxFactory,
) -> ExecutionRequest:
    """Everything the executor needs; raises InvalidTask when the task's post is gone.
    ``open_toolbox`` is ``task_toolbox``'s, possibly opened early."""
    thread, feed = await _thread_or_feed(runtime, hub, state, task=task, agent=agent)
    # One nonce for this run's untrusted-content delimiters: thread, feed, memory, tool results.
    blocks = UntrustedBlocks()
    scope, memory = await _scope_and_memory(
        runtime, state, task=task, agent=agent, thread=thread, feed=feed, blocks=blocks
    )
    journal = RedisJournal(runtime.redis, task.task_id)
    redact = runtime.redactor
    first = _prompt.first_message(
        task, agent, thread=thread, feed=feed, blocks=blocks, memory=memory
    )
    return ExecutionRequest(
        task=task,
        agent=agent,
        # Redacted here too: CLI executors hand these to their CLI, not to ModelBoundary.
        system=redact(_prompt.system_prompt(agent)),
        system_context=redact(_prompt.task_instructions(budget, blocks)),
        messages=[Message(role=first.role, content=redact(first.content))],
        settings=loop_settings(runtime, state, task, agent),
        worker_settings=runtime.settings,
        grants=effective_grants(runtime.settings, agent),
        open_toolbox=open_toolbox,
        # Every request of the native loop leaves through the boundary, last.
        make_model=lambda: ModelBoundary(
            runtime.make_model(agent), redact=redact, wrap_tool_result=blocks.tool_result
        ),
        observers=[metrics_observer(runtime.metrics, agent.config.name)],
        control=RedisControl(runtime.redis, task.task_id),
        journal=journal,
        resume=journal.load(),
        on_spawn=runtime.on_spawn,
        # CLI executors: the writes their gateway held back, counted here as the loop's are.
        on_write_refused=refusal_handler(runtime, task, agent),
        can_execute_tool=checking_replies(
            runtime.can_execute_tool, task, thread, hub_server=runtime.settings.hub_tool_server
        ),
        untrusted_nonce=blocks.nonce,
        scope=scope,
        on_scope_refused=scope_refusal_handler(runtime, state, task),
    )


async def _thread_or_feed(
    runtime: TaskRuntime, hub: HubClient, state: RunState, *, task: Task, agent: AgentDefinition
) -> tuple[Post | None, list[Post]]:
    """What the task answers, redacted: its thread (a notification) or a discovery feed."""
    if task.type is TaskType.NOTIFICATION:
        thread = state.thread = redacted_post(await _thread(runtime, hub, state, task), runtime)
        return thread, []
    return None, [
        redacted_post(post, runtime) for post in await _discovery_feed(hub, state, task, agent)
    ]


async def _scope_and_memory(
    runtime: TaskRuntime,
    state: RunState,
    *,
    task: Task,
    agent: AgentDefinition,
    thread: Post | None,
    feed: list[Post],
    blocks: UntrustedBlocks,
) -> tuple[TaskScope, str]:
    """The task's scope, fixed from the task, the definition, the operator and the Hub's
    answers before the model reads any; then what memory recalls within it, and the scope
    narrowed by the private memories recalled."""
    egress = EgressPolicy.of(runtime.settings)
    scope = state.scope.scope = task_scope(task, agent, thread=thread, feed=feed, egress=egress)
    memory = await _memory.recall(
        runtime,
        state,
        task=task,
        agent=agent,
        thread=thread,
        feed=feed,
        scope=scope,
        blocks=blocks,
        max_tokens=run_limits(task, agent).max_tokens,
    )
    scope = state.scope.scope = with_private_memory(scope, state.recalled_audiences, egress)
    _note_private(task, scope)
    return scope, memory


def _note_private(task: Task, scope: TaskScope) -> None:
    """A private task says so once, with why, before the model runs."""
    reach = scope.reach
    if reach.private:
        log_event(
            "task_private",
            task=task.task_id,
            agent=task.agent_id,
            reasons=list(reach.reasons),
            fetch_urls=len(reach.urls),
            allow=list(reach.allow),
        )


def redacted_post(post: Post, runtime: TaskRuntime) -> Post:
    """``post`` with its title, content and comments' content redacted, each whole."""
    redact = runtime.redactor
    comments = [c.model_copy(update={"content": redact(c.content)}) for c in post.comments]
    return post.model_copy(
        update={
            "title": redact(post.title) if post.title else post.title,
            "content": redact(post.content),
            "comments": comments,
        }
    )


async def _thread(runtime: TaskRuntime, hub: HubClient, state: RunState, task: Task) -> Post:
    assert task.post_id is not None
    try:
        return await hub.get_post(
            task.post_id, timeout_s=state.hub_timeout_s(runtime.settings.hub_timeout_s)
        )
    except HubNotFound:
        raise InvalidTask(
            f"post {task.post_id!r} of task {task.task_id} does not exist on the Hub"
        ) from None


async def _discovery_feed(
    hub: HubClient, state: RunState, task: Task, agent: AgentDefinition
) -> list[Post]:
    interests = agent.config.interests
    try:
        return await hub.discover_feed(
            communities=interests.communities,
            keywords=interests.keywords,
            exclude_responded=True,
            limit=_FEED_LIMIT,
            agent_id=agent.config.name,
            timeout_s=state.hub_timeout_s(_FEED_TIMEOUT_S),
        )
    except HubError as exc:
        log_event("discovery_feed_unavailable", "warning", task=task.task_id, error=str(exc))
        return []


def run_limits(task: Task, agent: AgentDefinition) -> RunLimits:
    """The agent's limits tightened by the task's constraints."""
    limits = task.constraints
    agent_limits = RunLimits(
        max_iterations=agent.config.behavior.max_iterations,
        max_tokens=agent.config.limits.max_tokens,
        max_duration_s=agent.config.limits.max_duration_s,
        max_cost_usd=agent.config.limits.max_cost_usd,
    )
    return agent_limits.tightened(
        max_iterations=limits.max_iterations,
        max_tokens=limits.max_tokens,
        max_duration_s=limits.max_duration_s,
        max_cost_usd=limits.max_cost_usd,
    )


def loop_settings(
    runtime: TaskRuntime, state: RunState, task: Task, agent: AgentDefinition
) -> LoopSettings:
    """The agent's limits tightened by the task's, and the operator's loop settings.
    What memory's embeddings spent before the run comes off its ``max_tokens``."""
    s, cfg = runtime.settings, agent.config
    limits = run_limits(task, agent)
    return LoopSettings(
        limits=replace(limits, max_tokens=max(0, limits.max_tokens - state.memory_tokens)),
        deadline_epoch=state.deadline.epoch_s if state.deadline else None,
        price=_call_price(runtime, agent),
        max_same_call_repeats=s.max_same_call_repeats,
        max_consecutive_error_steps=s.max_consecutive_error_steps,
        require_done_tool=cfg.behavior.require_done_tool,
        tool_output_max_chars=s.tool_output_max_chars,
        context_budget_chars=s.context_budget_chars,
        llm_timeout_cap_s=s.llm_timeout_s,
        tool_timeout_cap_s=s.mcp_timeout_s,
        max_output_tokens=cfg.brain.max_tokens,
        temperature=cfg.brain.temperature,
        # An exploration ends with a structured answer (``_discovery``).
        response_schema=(
            _discovery.response_schema() if task.type is TaskType.EXPLORATION else None
        ),
        response_schema_name=_discovery.SCHEMA_NAME,
        call_rules=TaskCallRules(
            task,
            hub_server=s.hub_tool_server,
            mcp_config=mcp_config(s.mcp_config) if s.mcp_config is not None else None,
        ),
        context_window_tokens=cfg.brain.max_context_tokens,
        redact=runtime.redactor,
    )


def _call_price(runtime: TaskRuntime, agent: AgentDefinition) -> ModelPrice | None:
    """The price a cost budget is planned with: the dearest model that may answer."""
    prices = runtime.prices or PriceTable.builtin()
    brain = agent.config.brain
    names = [brain.model, *(fallback.model for fallback in brain.fallbacks)]
    return dearest_price([prices.price(name) for name in names])
