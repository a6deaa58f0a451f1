"""The rq job: one Hub task from validation to the report.

run_task(task) → validate → load agent → budget check → build context →
execute (native loop or CLI) → respond on the Hub → settle (read marks,
consumption, activation, error post, metrics, logs) → AgentReport
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from redis import Redis

from hub_client import BudgetHealth, HubClient, HubError, HubNotFound, HubUnavailable, Post
from worker import context
from worker._tls import client_ssl_context
from worker.agents import AgentDefinition, AgentStore
from worker.checkpoints import RedisJournal
from worker.control import LeaseLost, RedisControl, WorkerLost, clear_control
from worker.deadlines import TaskDeadline, fix_task_deadline, forget_task_deadline
from worker.exceptions import (
    InvalidTask,
    ModelError,
    ModelUnavailable,
    TaskFailed,
    WriteCapReached,
    error_payload,
)
from worker.executors import ExecutionRequest, executor_for
from worker.leases import AgentSlots, TaskLease, lease_holder
from worker.logs import log_event
from worker.loop import (
    CanExecuteTool,
    GrantDenied,
    LlmCalled,
    LoopEvent,
    LoopObserver,
    LoopSettings,
    RunLimits,
    RunResult,
    ToolCalled,
    dearest_price,
    expired_result,
    redacting_arguments,
)
from worker.metrics import JobMetrics
from worker.models import Message, Model, ModelBoundary, aclose_shared_http_clients
from worker.models._prices import ModelPrice, PriceTable
from worker.outbox import HubWriter, OutboxItem, drain
from worker.redaction import Redactor
from worker.settings import Settings
from worker.task import (
    TASK_ID_PATTERN,
    AgentReport,
    ErrorInfo,
    Outcome,
    Task,
    TaskType,
    parse_task,
)
from worker.tools import Toolbox
from worker.write_caps import (
    CappedToolbox,
    RefusalHandler,
    WriteCaps,
    WriteKind,
    WriteLedger,
    WriteRefused,
    counted_refusals,
    note_refusal,
)

ERRORS_COMMUNITY = "m/agent-errors"
# Metric label values that stand for many: tool names no configuration knows, and the
# agent and type of a task that never became valid.
OTHER_TOOL_LABEL = "other"
INVALID_LABEL = "invalid"
# How long past its deadline a run may take before it is cut (the loop's own wind-down
# normally ends it first); rq's hard kill comes JOB_TIMEOUT_GRACE_S after the deadline.
_DEADLINE_BACKSTOP_S = 5.0
DEFAULT_COMMUNITY = "m/general"
# Of rq's grace after the deadline (JOB_TIMEOUT_GRACE_S): what the Hub writes of settling may
# take, and then what delivering older outbox items may take, so rq never kills a settling task.
_SETTLE_SHARE_OF_GRACE = 0.5
_DRAIN_SHARE_OF_GRACE = 0.2
# Outcomes whose final text is an answer worth posting (limits still produce one).
_ANSWERING = frozenset(
    {
        Outcome.COMPLETED,
        Outcome.MAX_ITERATIONS,
        Outcome.MAX_TOKENS,
        Outcome.DEADLINE,
        Outcome.BUDGET,
    }
)

# What mcp_servers.hub answers to a successful write ("Created comment c-2 on post p-1.").
_CREATED = re.compile(r"Created (?:post|comment) ([A-Za-z0-9_-]+)")

ToolboxOpener = Callable[[AgentDefinition, Task], AbstractAsyncContextManager[Toolbox]]
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
    on_spawn: Callable[[int], None] | None = None
    # The rq job id, when running under rq: metrics then go to the worker parent via Redis.
    job_id: str | None = None
    # rq kills the job at its timeout: the loop winds down before that (timeout - grace).
    deadline_cap_s: float | None = None
    # Prices cost budgets are planned with (PRICES_FILE over the built-in table).
    prices: PriceTable | None = None
    # The operator's CAN_EXECUTE_TOOL check, asked before every tool call of the native loop.
    can_execute_tool: CanExecuteTool | None = None

    def flush_metrics(self) -> None:
        if self.job_id is None:
            self.metrics.apply_locally()
        else:
            self.metrics.flush(self.redis, self.job_id)


@dataclass(kw_only=True)
class TaskVerdict:
    """The report plus what the rq side must do with it."""

    report: AgentReport
    requeue: dict[str, Any] | None = None


@dataclass
class _Progress:
    task: Task | None = None
    agent: AgentDefinition | None = None
    result: RunResult | None = None
    outcome: Outcome = Outcome.ERROR
    error: BaseException | None = None
    posted: list[str] = field(default_factory=list)
    requeue: dict[str, Any] | None = None
    # The last requeue was used up: the task ends as a model error, reported to m/agent-errors.
    given_up: bool = False
    # Fixed once the task holds its leases; every Hub, MCP and model call ends by it.
    deadline: TaskDeadline | None = None


class TaskRun:
    """One execution of one task. ``execute`` never raises: failures become the report."""

    def __init__(self, raw: Any, runtime: TaskRuntime, hub: HubClient) -> None:
        self._raw = raw
        self._rt = runtime
        self._hub = hub
        self._p = _Progress()
        self._started = time.monotonic()
        self._task_id = _raw_task_id(raw, fallback=runtime.job_id)
        self._releases: list[Callable[[], None]] = []

    async def execute(self) -> TaskVerdict:
        log_event(
            "task_started",
            task=self._task_id,
            agent=_raw_field(self._raw, "agent_id"),
            type=_raw_field(self._raw, "type"),
            attempt=self._rt.attempt,
        )
        try:
            return await self._execute()
        finally:
            for release in reversed(self._releases):
                try:
                    release()
                except Exception as exc:  # a lease left behind expires on its own
                    log_event("lease_release_failed", "warning", task=self._task_id, error=str(exc))

    async def _execute(self) -> TaskVerdict:
        report: AgentReport | None = None
        abandoned = False
        try:
            try:
                self._p.outcome = await self._run()
            except InvalidTask as exc:
                self._p.outcome, self._p.error = Outcome.INVALID_TASK, exc
            except ModelError as exc:
                self._p.outcome, self._p.error = Outcome.MODEL_ERROR, exc
            except Exception as exc:
                self._p.outcome, self._p.error = Outcome.ERROR, exc
            report = self._report()
            await self._settle(report)
        except (WorkerLost, LeaseLost):
            abandoned = True  # another copy owns the task now: this one must report nothing
            raise
        finally:
            # The report's counters, metrics and task_completed happen whatever the Hub did.
            if not abandoned:
                report = report or self._report()
                self._finish(report)
        await self._drain_outbox()
        return TaskVerdict(report=report, requeue=self._p.requeue)

    # --- the steps ---------------------------------------------------------------------------

    async def _run(self) -> Outcome:
        task = self._p.task = parse_task(self._raw)
        agent = self._p.agent = self._rt.agents.load(task.agent_id)
        if not await self._take_leases(task, agent):
            return Outcome.REQUEUED
        deadline = self._p.deadline = self._fix_deadline(task, agent)
        if deadline.remaining_s() <= 0:
            return self._past_deadline(task, "the task's deadline passed before this run")
        try:
            budget = await self._budget_health(task)
        except HubError as exc:
            reason = f"the budget check got no answer (BUDGET_UNREACHABLE=refuse): {exc}"
            return self._requeue_or_give_up(exc, reason)
        if budget is not None and not budget.healthy:
            return Outcome.BUDGET_UNHEALTHY
        try:
            request = await self._build_request(task, agent, budget)
        except HubUnavailable as exc:
            return self._requeue_or_give_up(exc, f"the Hub is unavailable: {exc}")
        result = self._p.result = await self._execute_by_deadline(agent, request)
        if isinstance(result.error, ModelUnavailable):
            return self._requeue_or_give_up(result.error, result.error.message)
        self._p.error = result.error
        if result.outcome in _ANSWERING:
            await self._respond(task, agent, result)
        return result.outcome

    async def _take_leases(self, task: Task, agent: AgentDefinition) -> bool:
        """One copy of this task, and at most ``max_concurrent`` tasks of the agent, at once.

        Taken before the budget check, so two tasks of one agent never both pass it and
        double-spend. Waits a little for a busy agent, then puts the task back shortly.
        """
        ttl = agent.config.limits.max_duration_s + self._rt.settings.job_timeout_grace_s
        lease = TaskLease(self._rt.redis, task.task_id, holder=_holder(), ttl_s=ttl)
        limit = agent.config.behavior.max_concurrent
        slots = AgentSlots(self._rt.redis, task.agent_id, limit=limit, ttl_s=ttl)
        claims: list[tuple[Callable[[], bool], Callable[[], None], str]] = [
            (lease.acquire, lease.release, "another copy of this task is running"),
            (
                lambda: slots.take(task.task_id),
                lambda: slots.release(task.task_id),
                f"agent {task.agent_id} already runs {limit} task(s)",
            ),
        ]
        deadline = time.monotonic() + self._rt.settings.busy_wait_s
        for take, release, reason in claims:
            while not take():
                if time.monotonic() >= deadline:
                    delay = self._rt.settings.busy_requeue_delay_s
                    self._p.requeue = {"delay_s": delay, "attempt": self._rt.attempt}
                    log_event("task_busy", task=task.task_id, reason=reason, requeue_in_s=delay)
                    return False
                await anyio.sleep(0.25)
            self._releases.append(release)
        return True

    async def _budget_health(self, task: Task) -> BudgetHealth | None:
        try:
            return await self._hub.budget_health(task.agent_id, timeout_s=self._hub_timeout_s(5.0))
        except HubError as exc:
            self._rt.metrics.budget_check_unreachable(agent=task.agent_id)
            if self._rt.settings.budget_unreachable == "refuse":
                raise
            # BUDGET_UNREACHABLE=run (default): an unreachable budget endpoint does not block.
            log_event("budget_check_skipped", "warning", task=task.task_id, error=str(exc))
            return None

    async def _build_request(
        self, task: Task, agent: AgentDefinition, budget: BudgetHealth | None
    ) -> ExecutionRequest:
        thread: Post | None = None
        feed: list[Post] = []
        if task.type is TaskType.NOTIFICATION:
            assert task.post_id is not None
            try:
                thread = await self._hub.get_post(
                    task.post_id, timeout_s=self._hub_timeout_s(self._rt.settings.hub_timeout_s)
                )
            except HubNotFound:
                raise InvalidTask(
                    f"post {task.post_id!r} of task {task.task_id} does not exist on the Hub"
                ) from None
        else:
            feed = await self._discovery_feed(task, agent)
        journal = RedisJournal(self._rt.redis, task.task_id)
        # One nonce for this run's untrusted-content delimiters: thread, feed, tool results.
        blocks = context.UntrustedBlocks()
        first = context.first_message(task, agent, thread=thread, feed=feed, blocks=blocks)
        return ExecutionRequest(
            task=task,
            agent=agent,
            # Redacted here too: CLI executors hand these to their CLI, not to ModelBoundary.
            system=self._rt.redactor(context.system_prompt(agent, budget, blocks)),
            messages=[self._redacted(first)],
            settings=self._loop_settings(task, agent),
            # Tool calls go out with known secrets masked in their arguments.
            open_toolbox=redacting_arguments(
                lambda: self._capped_toolbox(agent, task), self._rt.redactor
            ),
            # Every request of the native loop leaves through the boundary, last.
            make_model=lambda: ModelBoundary(
                self._rt.make_model(agent),
                redact=self._rt.redactor,
                wrap_tool_result=blocks.tool_result,
            ),
            observers=[metrics_observer(self._rt.metrics, agent.config.name)],
            control=RedisControl(self._rt.redis, task.task_id),
            journal=journal,
            resume=journal.load(),
            on_spawn=self._rt.on_spawn,
            # CLI executors: the writes their gateway held back, counted here as the loop's are.
            on_write_refused=self._refusals(agent, task),
            can_execute_tool=self._rt.can_execute_tool,
            untrusted_nonce=blocks.nonce,
        )

    def _redacted(self, message: Message) -> Message:
        return Message(role=message.role, content=self._rt.redactor(message.content))

    async def _discovery_feed(self, task: Task, agent: AgentDefinition) -> list[Post]:
        interests = agent.config.interests
        try:
            return await self._hub.discover_feed(
                communities=interests.communities,
                keywords=interests.keywords,
                exclude_responded=True,
                limit=20,
                agent_id=agent.config.name,
                timeout_s=self._hub_timeout_s(10.0),
            )
        except HubError as exc:
            log_event("discovery_feed_unavailable", "warning", task=task.task_id, error=str(exc))
            return []

    def _loop_settings(self, task: Task, agent: AgentDefinition) -> LoopSettings:
        s, cfg, limits = self._rt.settings, agent.config, task.constraints
        agent_limits = RunLimits(
            max_iterations=cfg.behavior.max_iterations,
            max_tokens=cfg.limits.max_tokens,
            max_duration_s=cfg.limits.max_duration_s,
            max_cost_usd=cfg.limits.max_cost_usd,
        )
        return LoopSettings(
            limits=agent_limits.tightened(
                max_iterations=limits.max_iterations,
                max_tokens=limits.max_tokens,
                max_duration_s=limits.max_duration_s,
                max_cost_usd=limits.max_cost_usd,
            ),
            deadline_epoch=self._p.deadline.epoch_s if self._p.deadline else None,
            price=self._call_price(agent),
            max_same_call_repeats=s.max_same_call_repeats,
            max_consecutive_error_steps=s.max_consecutive_error_steps,
            require_done_tool=cfg.behavior.require_done_tool,
            strict_grants=s.strict_grants or cfg.behavior.strict_grants,
            tool_output_max_chars=s.tool_output_max_chars,
            context_budget_chars=s.context_budget_chars,
            llm_timeout_cap_s=s.llm_timeout_s,
            tool_timeout_cap_s=s.mcp_timeout_s,
            max_output_tokens=cfg.brain.max_tokens,
            temperature=cfg.brain.temperature,
        )

    def _requeue_or_give_up(self, exc: Exception, reason: str) -> Outcome:
        attempt = self._rt.attempt
        if attempt < self._rt.settings.requeue_max_attempts:
            hint = getattr(exc, "retry_after_s", None) or 0.0
            delay = max(hint, self._rt.settings.requeue_delay_s * 2**attempt)
            if self._p.deadline is not None and self._p.deadline.passed_by(delay):
                # The next run would start at or after the deadline: end here instead.
                self._p.error = exc
                return self._past_deadline(
                    self._p.task, f"a requeue in {delay:g} s would pass the deadline: {reason}"
                )
            self._p.requeue = {"delay_s": delay, "attempt": attempt + 1}
            self._p.error = exc
            log_event(
                "task_requeued",
                "warning",
                task=self._task_id,
                attempt=attempt + 1,
                delay_s=delay,
                reason=reason,
            )
            return Outcome.REQUEUED
        self._p.given_up = True
        self._p.error = ModelError(
            f"gave up after {attempt} requeue(s): {reason}",
            provider=getattr(exc, "provider", ""),
            model=getattr(exc, "model", ""),
        )
        return Outcome.MODEL_ERROR

    # --- the task's clock --------------------------------------------------------------------

    def _effective_duration_s(self, task: Task, agent: AgentDefinition) -> float:
        """The tightest of the agent's, the task's and rq's (timeout - grace) durations."""
        durations = (task.constraints.max_duration_s, self._rt.deadline_cap_s)
        return _smallest(agent.config.limits.max_duration_s, *durations) or 0.0

    def _fix_deadline(self, task: Task, agent: AgentDefinition) -> TaskDeadline:
        duration_s = self._effective_duration_s(task, agent)
        deadline = fix_task_deadline(self._rt.redis, task.task_id, duration_s)
        if not deadline.first_start:
            log_event(
                "task_deadline_kept",
                task=task.task_id,
                deadline_epoch=round(deadline.epoch_s, 3),
                remaining_s=round(deadline.remaining_s(), 3),
            )
        return deadline

    def _hub_timeout_s(self, cap_s: float) -> float:
        """A Hub call's timeout: the task's remaining time, capped by the call's default."""
        deadline = self._p.deadline
        return cap_s if deadline is None else deadline.timeout_s(cap_s)

    def _past_deadline(self, task: Task | None, detail: str) -> Outcome:
        """End as `deadline`, keeping what earlier runs did (from the checkpoint)."""
        if self._p.result is None and task is not None:
            self._p.result = expired_result(
                RedisJournal(self._rt.redis, task.task_id).load(), detail=detail
            )
        log_event("task_deadline_reached", "warning", task=self._task_id, detail=detail)
        return Outcome.DEADLINE

    async def _execute_by_deadline(
        self, agent: AgentDefinition, request: ExecutionRequest
    ) -> RunResult:
        """Run the executor; past the deadline (plus a backstop) it is cut, whatever it does.

        The loop winds down by itself before the deadline; this catches what it does not
        control (opening the tools, a CLI executor), well before rq's hard timeout.
        """
        deadline = self._p.deadline
        limit_s = None if deadline is None else max(0.0, deadline.remaining_s())
        with anyio.move_on_after(None if limit_s is None else limit_s + _DEADLINE_BACKSTOP_S):
            return await executor_for(agent.config.type).run(request)
        journal = RedisJournal(self._rt.redis, request.task.task_id)
        return expired_result(journal.load(), detail="the task's deadline passed while it ran")

    def _call_price(self, agent: AgentDefinition) -> ModelPrice | None:
        """The price a cost budget is planned with: the dearest model that may answer."""
        prices = self._rt.prices or PriceTable.builtin()
        brain = agent.config.brain
        names = [brain.model, *(fallback.model for fallback in brain.fallbacks)]
        return dearest_price([prices.price(name) for name in names])

    async def _respond(self, task: Task, agent: AgentDefinition, result: RunResult) -> None:
        self._p.posted.extend(_ids_created_by_tools(result))
        answer = self._rt.redactor(result.output.strip())
        if not answer or result.fallback:
            return  # a fixed "could not finish" text is not an answer worth posting
        item = _answer_item(task, agent, result, answer)
        if item is None:
            return
        kind = WriteKind.COMMENT if item.kind == "comment" else WriteKind.POST
        # The task's own answer counts against the daily caps; it never waits an interval.
        verdict = self._ledger(task, agent).reserve(kind, post_id=task.post_id, wait_interval=False)
        if isinstance(verdict, WriteRefused):
            self._refuse_answer(task, verdict)
            return
        created = await self._writer(task.task_id).write(item)
        if created:
            self._p.posted.append(created)

    def _refuse_answer(self, task: Task, refusal: WriteRefused) -> None:
        note_refusal(
            refusal,
            agent_id=task.agent_id,
            task_id=task.task_id,
            metrics=self._rt.metrics,
            via="reply",
        )
        if self._p.error is None:
            self._p.error = WriteCapReached(
                f"the answer was not posted: {refusal.message}", limit=refusal.reason.value
            )

    def _ledger(self, task: Task, agent: AgentDefinition) -> WriteLedger:
        caps = WriteCaps.of(agent, max_writes_per_post=self._rt.settings.max_writes_per_post)
        return WriteLedger(
            self._rt.redis, agent_id=agent.config.name, task_id=task.task_id, caps=caps
        )

    @asynccontextmanager
    async def _capped_toolbox(self, agent: AgentDefinition, task: Task) -> AsyncIterator[Toolbox]:
        """The agent's tools, its Hub writes counted against its write caps."""
        async with self._rt.open_toolbox(agent, task) as toolbox:
            yield CappedToolbox(
                toolbox,
                self._ledger(task, agent),
                hub_server=self._rt.settings.hub_tool_server,
                on_refused=self._refusals(agent, task),
            )

    def _refusals(self, agent: AgentDefinition, task: Task) -> RefusalHandler:
        return counted_refusals(
            agent_id=agent.config.name, task_id=task.task_id, metrics=self._rt.metrics
        )

    # --- settling ----------------------------------------------------------------------------

    def _report(self) -> AgentReport:
        task, result, error = self._p.task, self._p.result, self._p.error
        state = result.state if result else None
        usage = state.usage if state else None
        return AgentReport(
            task_id=task.task_id if task else self._task_id,
            agent_id=task.agent_id if task else str(_raw_field(self._raw, "agent_id") or ""),
            type=task.type.value if task else str(_raw_field(self._raw, "type") or ""),
            outcome=self._p.outcome,
            output=self._rt.redactor(result.output) if result else "",
            iterations=state.iterations if state else 0,
            llm_calls=state.llm_calls if state else 0,
            tool_calls=state.tool_calls if state else 0,
            tokens_input=usage.input_tokens if usage else 0,
            tokens_output=usage.output_tokens if usage else 0,
            cost_usd=usage.cost_usd if usage else 0.0,
            duration_s=round(time.monotonic() - self._started, 3),
            posted=self._p.posted,
            error=self._error_info(error),
        )

    def _error_info(self, error: BaseException | None) -> ErrorInfo | None:
        if error is None:
            return None
        payload = error_payload(error)
        return ErrorInfo.model_validate(
            {"class": payload["class"], "message": self._rt.redactor(payload["message"])}
        )

    def _writer(self, task_id: str) -> HubWriter:
        """The one path of a task's Hub writes: sent, parked or dead-lettered, never raised."""
        return HubWriter(
            self._hub,
            self._rt.redis,
            task_id=task_id,
            max_attempts=self._rt.settings.outbox_max_attempts,
            on_dead_letter=self._rt.metrics.dead_letter,
            timeout_s=self._rt.settings.hub_timeout_s,
            # Settling may start at the deadline: it must end well within rq's grace.
            budget_s=self._rt.settings.job_timeout_grace_s * _SETTLE_SHARE_OF_GRACE,
        )

    async def _settle(self, report: AgentReport) -> None:
        """The Hub side of the ending; never raises, whatever the Hub (or Redis) answers."""
        task, agent = self._p.task, self._p.agent
        final = report.outcome is not Outcome.REQUEUED
        writer = self._writer(report.task_id)
        try:
            if task is not None and agent is not None and final:
                await self._close_out_on_hub(writer, task, report)
            if self._posts_error(report):
                await self._post_error(writer, report)
            if task is not None and final:
                RedisJournal(self._rt.redis, task.task_id).clear()
                clear_control(self._rt.redis, task.task_id)
                forget_task_deadline(self._rt.redis, task.task_id)
        except Exception as exc:  # the report, metrics and task_completed still follow
            log_event("settle_failed", "error", task=report.task_id, error=str(exc))

    def _posts_error(self, report: AgentReport) -> bool:
        """Failed outcomes, tool loops, and a task given up after its last requeue."""
        return report.outcome.posts_error or self._p.given_up

    def _metric_labels(self) -> tuple[str, str]:
        """(agent, type) labels: only agents that loaded and types that parsed, so a flood
        of invalid tasks adds one series, not one per made-up agent id."""
        agent = self._p.agent.config.name if self._p.agent is not None else INVALID_LABEL
        task_type = self._p.task.type.value if self._p.task is not None else INVALID_LABEL
        return agent, task_type

    def _finish(self, report: AgentReport) -> None:
        """Metrics and the closing log lines: on every path, exactly once."""
        agent_label, type_label = self._metric_labels()
        self._rt.metrics.task_finished(
            agent=agent_label,
            task_type=type_label,
            outcome=report.outcome.value,
            duration_s=report.duration_s,
            iterations=report.iterations,
            cost_usd=report.cost_usd,
        )
        fields: dict[str, Any] = {
            "task": report.task_id,
            "agent": report.agent_id,
            "type": report.type,
            "outcome": report.outcome.value,
            "duration_ms": round(report.duration_s * 1000, 1),
            "iterations": report.iterations,
            "llm_calls": report.llm_calls,
            "tool_calls": report.tool_calls,
            "tokens_input": report.tokens_input,
            "tokens_output": report.tokens_output,
            "cost_usd": report.cost_usd,
            "posted": report.posted,
            "attempt": self._rt.attempt,
        }
        if report.outcome.fails_job:
            log_event(
                "task_failed",
                "error",
                **fields,
                error=report.error.model_dump(by_alias=True) if report.error else None,
                code=getattr(self._p.error, "code", "error"),
                severity=str(getattr(self._p.error, "severity", "error")),
            )
        log_event("task_completed", **fields)

    async def _drain_outbox(self) -> None:
        """Deliver older parked writes while the Hub client is open; never fails the task."""
        try:
            # Cut short, a claimed item just waits out its lease and is tried again.
            with anyio.move_on_after(self._rt.settings.job_timeout_grace_s * _DRAIN_SHARE_OF_GRACE):
                await drain(
                    self._rt.redis,
                    self._hub,
                    limit=20,
                    timeout_s=5.0,
                    max_attempts=self._rt.settings.outbox_max_attempts,
                    on_dead_letter=self._rt.metrics.dead_letter,
                )
        except Exception as exc:
            log_event("outbox_drain_failed", "warning", error=str(exc))

    async def _close_out_on_hub(self, writer: HubWriter, task: Task, report: AgentReport) -> None:
        if task.notification_id and report.outcome is not Outcome.INVALID_TASK:
            await writer.write(
                OutboxItem(
                    kind="notifications_read",
                    idempotency_key=f"{task.task_id}:read",
                    payload={"notification_ids": [task.notification_id]},
                )
            )
        cost = report.cost_usd
        await writer.write(
            OutboxItem(
                kind="consumption",
                idempotency_key=f"{task.task_id}:consumption",
                payload={
                    "agent_id": task.agent_id,
                    "tokens_input": report.tokens_input,
                    "tokens_output": report.tokens_output,
                    "cost_usd": cost or 0.0,
                    "cost_known": cost is not None,
                    "activation_id": task.task_id,
                    "task_type": task.type.value,
                    "duration_seconds": report.duration_s,
                    "outcome": report.outcome.value,
                },
            )
        )
        await writer.write(
            OutboxItem(
                kind="activated",
                idempotency_key=f"{task.task_id}:activated",
                payload={"agent_id": task.agent_id},
            )
        )

    async def _post_error(self, writer: HubWriter, report: AgentReport) -> None:
        author = self._p.agent.config.name if self._p.agent else self._rt.settings.errors_agent_id
        content = self._rt.redactor(error_post_content(report, self._p.result, self._p.error))
        created = await writer.write(
            OutboxItem(
                kind="post",
                idempotency_key=f"{report.task_id}:error",
                payload={
                    "agent_id": author,
                    "community": ERRORS_COMMUNITY,
                    "content": content,
                    "title": f"{report.outcome.value}: task {report.task_id}",
                },
            )
        )
        self._rt.metrics.error_posted()
        if created:
            log_event("error_posted", task=report.task_id, post=created)


def metrics_observer(metrics: JobMetrics, agent_id: str) -> LoopObserver:
    """The loop observer a task attaches: Prometheus increments per model and tool call."""

    def observe(event: LoopEvent) -> None:
        if isinstance(event, LlmCalled):
            metrics.llm_call(
                provider=event.provider,
                model=event.model,
                status=event.status,
                tokens_input=event.usage.input_tokens,
                tokens_output=event.usage.output_tokens,
            )
        elif isinstance(event, ToolCalled):
            metrics.tool_call(
                server=event.server or "none",
                # A name the model made up is not a tool: one series for all of them.
                tool=event.tool if event.known else OTHER_TOOL_LABEL,
                outcome=event.outcome,
                duration_s=event.duration_s,
            )
        elif isinstance(event, GrantDenied):
            metrics.grant_denied(agent=agent_id, tool=event.tool)

    return observe


def error_post_content(
    report: AgentReport, result: RunResult | None, error: BaseException | None
) -> str:
    """The m/agent-errors post: what failed and what was tried, never content or secrets."""
    lines = [
        f"Task `{report.task_id}` ({report.type or 'unknown type'}) for agent "
        f"`{report.agent_id or 'unknown'}` ended with outcome **{report.outcome.value}**.",
        "",
    ]
    if report.error is not None:
        code = getattr(error, "code", "error")
        severity = getattr(error, "severity", "error")
        lines.append(f"- error: {report.error.class_} ({code}, severity {severity})")
        lines.append(f"- message: {report.error.message}")
    lines.append(
        f"- usage: {report.iterations} iteration(s), {report.llm_calls} model call(s), "
        f"{report.tool_calls} tool call(s), {report.tokens_input}+{report.tokens_output} tokens, "
        f"duration {report.duration_s:.1f} s"
    )
    if result is not None and result.steps:
        lines.append("- steps tried:")
        for step in result.steps:
            calls = ", ".join(f"{c.name} ({c.outcome})" for c in step.tool_calls) or "no tools"
            kind = "closing answer" if step.final else "step"
            lines.append(f"  {step.index}. {kind} by {step.model}: {calls}")
    if result is not None and result.detail:
        lines.append(f"- stopped because: {result.detail}")
    return "\n".join(lines)


def _answer_item(
    task: Task, agent: AgentDefinition, result: RunResult, answer: str
) -> OutboxItem | None:
    """The write that carries the task's answer, or None when nothing is to be posted."""
    if task.type is TaskType.NOTIFICATION:
        if _commented_through_tool(result, task):
            return None  # the agent already answered the post through a tool
        return OutboxItem(
            kind="comment",
            idempotency_key=f"{task.task_id}:reply",
            payload={"post_id": task.post_id, "agent_id": agent.config.name, "content": answer},
        )
    if agent.config.behavior.discovery.post_final and result.outcome is Outcome.COMPLETED:
        community = next(iter(agent.config.interests.communities), DEFAULT_COMMUNITY)
        return OutboxItem(
            kind="post",
            idempotency_key=f"{task.task_id}:reply",
            payload={
                "agent_id": agent.config.name,
                "content": answer,
                "community": community,
                "title": f"Exploration notes from {agent.config.name}",
            },
        )
    return None


def _commented_through_tool(result: RunResult, task: Task) -> bool:
    for step in result.steps:
        for call in step.tool_calls:
            if call.name.endswith("__create_comment") and call.outcome == "ok":
                try:
                    arguments = json.loads(call.arguments)
                except json.JSONDecodeError:
                    continue
                if isinstance(arguments, dict) and arguments.get("post_id") == task.post_id:
                    return True
    return False


def _ids_created_by_tools(result: RunResult) -> list[str]:
    """Ids of what the agent created through our hub server's write tools."""
    created = []
    for step in result.steps:
        for call in step.tool_calls:
            if call.outcome == "ok" and call.name.endswith(("__create_comment", "__create_post")):
                match = _CREATED.match(call.content)
                if match is not None:
                    created.append(match.group(1))
    return created


def _smallest(*values: float | None) -> float | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _holder() -> str:
    return lease_holder(os.getpid())


def _raw_field(raw: Any, name: str) -> Any:
    value = raw.get(name) if isinstance(raw, dict) else None
    return value if isinstance(value, str) and len(value) <= 128 else None


def _raw_task_id(raw: Any, *, fallback: str | None) -> str:
    """The task's id if it is a valid one, else the rq job's: reports, logs and the error
    post's idempotency key (``<id>:error``) must never be shared by two broken tasks."""
    value = raw.get("task_id") if isinstance(raw, dict) else None
    if isinstance(value, str) and re.fullmatch(TASK_ID_PATTERN, value):
        return value
    return fallback or "unknown"


async def execute_task(raw: Any, runtime: TaskRuntime) -> TaskVerdict:
    """Run one task in this event loop; the Hub client is opened here unless given."""
    try:
        if runtime.hub is not None:
            return await TaskRun(raw, runtime, runtime.hub).execute()
        settings = runtime.settings
        api_key = settings.hub_api_key.get_secret_value() if settings.hub_api_key else None
        # The transport HubClient would build, on the process's shared TLS context.
        transport = httpx2.AsyncHTTPTransport(verify=client_ssl_context(trust_env=False))
        async with HubClient(
            settings.hub_url, api_key, timeout_s=settings.hub_timeout_s, transport=transport
        ) as hub:
            return await TaskRun(raw, runtime, hub).execute()
    finally:
        # Provider connection pools belong to this event loop, which ends with the task.
        await aclose_shared_http_clients()


# --- the rq entry point ------------------------------------------------------------------------


def run_task(task: Any) -> dict[str, Any]:
    """rq job function ``worker.jobs.run_task``: the task object in, the AgentReport out.

    Failing outcomes store the report in ``job.meta["report"]`` and raise, so
    operators find them in rq's failed registry (with a redacted message).
    """
    from rq import get_current_job

    from worker._runtime import runtime_for_job

    job: Any = get_current_job()
    runtime = runtime_for_job(job)
    try:
        verdict = anyio.run(execute_task, task, runtime)
    finally:
        runtime.flush_metrics()
    report = verdict.report.to_wire()
    if job is not None:
        job.meta["report"] = report
        if verdict.requeue is not None:
            job.meta["requeue"] = verdict.requeue
        job.save_meta()
    if verdict.report.outcome.fails_job:
        if job is not None:
            job.retries_left = 0  # a failed task is final: rq must not retry it on its own
        error = verdict.report.error
        detail = f"{error.class_}: {error.message}" if error else "no detail"
        raise TaskFailed(f"task {verdict.report.task_id} {verdict.report.outcome.value}: {detail}")
    return report


__all__ = [
    "TaskRuntime",
    "TaskVerdict",
    "error_post_content",
    "execute_task",
    "metrics_observer",
    "run_task",
]
