"""One run of one task, as named steps.

    parse → load agent → take leases → fix deadline → open the tools (in the background)
    → check budget → build request (memory recalled) → execute → respond → remember
    → report → settle → finish
    → drain the outbox → verdict

``TaskRun.execute`` never raises for the task's own failures: they become the report.
It raises only WorkerLost/LeaseLost, when another copy owns the task and this one must
report nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx2

from hub_client import BudgetHealth, HubClient, HubError, HubUnavailable
from hub_client.retry_rules import Backoff
from worker._network import client_ssl_context
from worker._process_loop import process_transport
from worker.agents import AgentDefinition
from worker.coordination import (
    AgentSlots,
    LeaseLost,
    RedisJournal,
    TaskDeadline,
    TaskLease,
    WorkerLost,
    current_lease_holder,
    fix_task_deadline,
)
from worker.exceptions import InvalidTask, ModelError, ModelUnavailable
from worker.executors import ExecutionRequest, Executor, executor_for
from worker.logs import log_event
from worker.loop import RunResult, expired_result
from worker.models import aclose_shared_http_clients
from worker.pipeline import _memory
from worker.pipeline._context import build_request, task_toolbox
from worker.pipeline._early_tools import ToolboxFactory, tools_opened_early
from worker.pipeline._respond import respond
from worker.pipeline._runtime import TaskRuntime
from worker.pipeline._settle import build_report, drain_outbox, finish, settle
from worker.pipeline._state import Requeue, RunState, TaskVerdict
from worker.task import AgentReport, Outcome, Task, parse_task, raw_field, raw_task_id
from worker.tracing import TracingTransport, traced_agent_run

# How long past its deadline a run may take before it is cut (the loop's own wind-down
# normally ends it first); rq's hard kill comes JOB_TIMEOUT_GRACE_S after the deadline.
_DEADLINE_BACKSTOP_S = 5.0
_BUDGET_CHECK_TIMEOUT_S = 5.0
_BUSY_POLL_S = 0.25


class TaskRun:
    """One execution of one task. ``execute`` never raises: failures become the report."""

    def __init__(self, raw: Any, runtime: TaskRuntime, hub: HubClient) -> None:
        self._raw = raw
        self._rt = runtime
        self._hub = hub
        self._state = RunState()
        self._started = time.monotonic()
        self._task_id = raw_task_id(raw, fallback=runtime.job_id)
        self._releases: list[Callable[[], None]] = []

    async def execute(self) -> TaskVerdict:
        log_event(
            "task_started",
            task=self._task_id,
            agent=raw_field(self._raw, "agent_id"),
            type=raw_field(self._raw, "type"),
            attempt=self._rt.attempt,
        )
        try:
            return await self._execute()
        finally:
            self._release_leases()

    async def _execute(self) -> TaskVerdict:
        report: AgentReport | None = None
        abandoned = False
        try:
            await self._run_to_outcome()
            report = self._report()
            await settle(self._rt, self._hub, self._state, report)
        except (WorkerLost, LeaseLost):
            abandoned = True  # another copy owns the task now: this one must report nothing
            raise
        finally:
            # The report's counters, metrics and task_completed happen whatever the Hub did.
            if not abandoned:
                report = report or self._report()
                finish(self._rt, self._state, report)
        await drain_outbox(self._rt, self._hub)
        return TaskVerdict(report=report, next_run=self._state.requeue)

    async def _run_to_outcome(self) -> None:
        """Run the task; the failures it ends by become its outcome and error."""
        state = self._state
        try:
            state.outcome = await self._run()
        except InvalidTask as exc:
            state.outcome, state.error = Outcome.INVALID_TASK, exc
        except ModelError as exc:
            state.outcome, state.error = Outcome.MODEL_ERROR, exc
        except Exception as exc:
            state.outcome, state.error = Outcome.ERROR, exc

    # --- the steps ---------------------------------------------------------------------------

    async def _run(self) -> Outcome:
        task = self._state.task = parse_task(self._raw)
        agent = self._state.agent = self._rt.agents.load(task.agent_id)
        skip_reason = agent.config.behavior.reason_to_skip(task.type, task.notification_type)
        if skip_reason is not None:
            return self._skip(task, skip_reason)
        if not await self._take_leases(task, agent):
            return Outcome.REQUEUED
        deadline = self._state.deadline = self._fix_deadline(task, agent)
        if deadline.remaining_s() <= 0:
            return self._past_deadline(task, "the task's deadline passed before this run")
        executor = executor_for(agent.config.type)
        # The MCP sessions open while the Hub answers the budget and thread reads.
        async with tools_opened_early(
            task_toolbox(self._rt, self._state, task, agent), early=executor.uses_toolbox
        ) as open_toolbox:
            return await self._run_with_tools(task, agent, executor, open_toolbox)

    async def _run_with_tools(
        self, task: Task, agent: AgentDefinition, executor: Executor, open_toolbox: ToolboxFactory
    ) -> Outcome:
        try:
            budget = await self._budget_health(task)
        except HubError as exc:
            reason = f"the budget check got no answer (BUDGET_UNREACHABLE=refuse): {exc}"
            return self._requeue_or_give_up(exc, reason)
        if budget is not None and not budget.healthy:
            return Outcome.BUDGET_UNHEALTHY
        try:
            request = await build_request(
                self._rt,
                self._hub,
                self._state,
                task=task,
                agent=agent,
                budget=budget,
                open_toolbox=open_toolbox,
            )
        except HubUnavailable as exc:
            return self._requeue_or_give_up(exc, f"the Hub is unavailable: {exc}")
        result = self._state.result = await self._execute_by_deadline(executor, request)
        if isinstance(result.error, ModelUnavailable):
            return self._requeue_or_give_up(result.error, result.error.message)
        self._state.error = result.error
        if result.outcome.answers:
            await respond(self._rt, self._hub, self._state, task=task, agent=agent, result=result)
            spent = result.state.usage.total_tokens
            await _memory.remember(
                self._rt,
                self._state,
                task=task,
                agent=agent,
                result=result,
                token_allowance=request.settings.limits.max_tokens - spent,
            )
        return result.outcome

    def _skip(self, task: Task, reason: str) -> Outcome:
        """The agent does not take this task: no model call, nothing posted, no lease held."""
        self._state.detail = reason
        log_event("task_skipped", task=task.task_id, agent=task.agent_id, reason=reason)
        return Outcome.SKIPPED

    async def _take_leases(self, task: Task, agent: AgentDefinition) -> bool:
        """One copy of this task, and at most ``max_concurrent`` tasks of the agent, at once.

        Taken before the budget check, so two tasks of one agent never both pass it and
        double-spend. Waits a little for a busy agent, then puts the task back shortly.
        """
        settings = self._rt.settings
        ttl = agent.config.limits.max_duration_s + settings.job_timeout_grace_s
        lease = TaskLease(self._rt.redis, task.task_id, holder=current_lease_holder(), ttl_s=ttl)
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
        deadline = time.monotonic() + settings.busy_wait_s
        for take, release, reason in claims:
            while not take():
                if time.monotonic() >= deadline:
                    delay = settings.busy_requeue_delay_s
                    self._state.requeue = Requeue(
                        delay_s=delay, attempt=self._rt.attempt, reason=reason
                    )
                    log_event("task_busy", task=task.task_id, reason=reason, requeue_in_s=delay)
                    return False
                await anyio.sleep(_BUSY_POLL_S)
            self._releases.append(release)
        return True

    def _release_leases(self) -> None:
        for release in reversed(self._releases):
            try:
                release()
            except Exception as exc:  # a lease left behind expires on its own
                log_event("lease_release_failed", "warning", task=self._task_id, error=str(exc))

    async def _budget_health(self, task: Task) -> BudgetHealth | None:
        try:
            return await self._hub.budget_health(
                task.agent_id, timeout_s=self._state.hub_timeout_s(_BUDGET_CHECK_TIMEOUT_S)
            )
        except HubError as exc:
            self._rt.metrics.budget_check_unreachable(agent=task.agent_id)
            if self._rt.settings.budget_unreachable == "refuse":
                raise
            # BUDGET_UNREACHABLE=run (default): an unreachable budget endpoint does not block.
            log_event("budget_check_skipped", "warning", task=task.task_id, error=str(exc))
            return None

    def _requeue_or_give_up(self, exc: Exception, reason: str) -> Outcome:
        attempt = self._rt.attempt
        if attempt >= self._rt.settings.requeue_max_attempts:
            self._state.given_up = True
            self._state.error = ModelError(
                f"gave up after {attempt} requeue(s): {reason}",
                provider=getattr(exc, "provider", ""),
                model=getattr(exc, "model", ""),
            )
            return Outcome.MODEL_ERROR
        hint = getattr(exc, "retry_after_s", None) or 0.0
        delay = max(hint, Backoff(first_s=self._rt.settings.requeue_delay_s).delay_s(attempt))
        self._state.error = exc
        if self._state.deadline is not None and self._state.deadline.passed_by(delay):
            # The next run would start at or after the deadline: end here instead.
            return self._past_deadline(
                self._state.task, f"a requeue in {delay:g} s would pass the deadline: {reason}"
            )
        self._state.requeue = Requeue(delay_s=delay, attempt=attempt + 1, reason=reason)
        log_event(
            "task_requeued",
            "warning",
            task=self._task_id,
            attempt=attempt + 1,
            delay_s=delay,
            reason=reason,
        )
        return Outcome.REQUEUED

    # --- the task's clock --------------------------------------------------------------------

    def _fix_deadline(self, task: Task, agent: AgentDefinition) -> TaskDeadline:
        """The tightest of the agent's, the task's and rq's (timeout - grace) durations,
        fixed at the first run: a re-run keeps it."""
        durations = (task.constraints.max_duration_s, self._rt.deadline_cap_s)
        duration_s = _smallest(agent.config.limits.max_duration_s, *durations) or 0.0
        deadline = fix_task_deadline(self._rt.redis, task.task_id, duration_s)
        if not deadline.first_start:
            log_event(
                "task_deadline_kept",
                task=task.task_id,
                deadline_epoch=round(deadline.epoch_s, 3),
                remaining_s=round(deadline.remaining_s(), 3),
            )
        return deadline

    def _past_deadline(self, task: Task | None, detail: str) -> Outcome:
        """End as `deadline`, keeping what earlier runs did (from the checkpoint)."""
        if self._state.result is None and task is not None:
            self._state.result = expired_result(
                RedisJournal(self._rt.redis, task.task_id).load(), detail=detail
            )
        log_event("task_deadline_reached", "warning", task=self._task_id, detail=detail)
        return Outcome.DEADLINE

    async def _execute_by_deadline(
        self, executor: Executor, request: ExecutionRequest
    ) -> RunResult:
        """Run the executor; past the deadline (plus a backstop) it is cut, whatever it does.

        The loop winds down by itself before the deadline; this catches what it does not
        control (opening the tools, a CLI executor), well before rq's hard timeout.
        """
        deadline = self._state.deadline
        limit_s = None if deadline is None else max(0.0, deadline.remaining_s())
        with anyio.move_on_after(None if limit_s is None else limit_s + _DEADLINE_BACKSTOP_S):
            return await executor.run(request)
        journal = RedisJournal(self._rt.redis, request.task.task_id)
        return expired_result(journal.load(), detail="the task's deadline passed while it ran")

    def _report(self) -> AgentReport:
        return build_report(
            self._rt, self._state, raw=self._raw, task_id=self._task_id, started=self._started
        )


def _smallest(*values: float | None) -> float | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def hub_transport(concurrency: int) -> httpx2.AsyncBaseTransport:
    """The process's pooled connections to the Hub (a job process: this task's own)."""

    # SSL_CERT_FILE / SSL_CERT_DIR are honoured, as for the model providers: a Hub behind
    # a private CA is trusted the way the operator trusts it.
    def pooled(limits: httpx2.Limits) -> httpx2.AsyncBaseTransport:
        return httpx2.AsyncHTTPTransport(verify=client_ssl_context(), limits=limits)

    return process_transport("hub", pooled, concurrency=concurrency) or httpx2.AsyncHTTPTransport(
        verify=client_ssl_context()
    )


@traced_agent_run  # the task's invoke_agent span
async def execute_task(raw: Any, runtime: TaskRuntime) -> TaskVerdict:
    """Run one task in this event loop; the Hub client is opened here unless given."""
    try:
        if runtime.hub is not None:
            return await TaskRun(raw, runtime, runtime.hub).execute()
        settings = runtime.settings
        api_key = settings.hub_api_key.get_secret_value() if settings.hub_api_key else None
        # The transport HubClient would build, on the process's shared TLS context; each
        # Hub call is a client span carrying traceparent.
        transport = TracingTransport(hub_transport(settings.worker_concurrency))
        async with HubClient(
            settings.hub_url, api_key, timeout_s=settings.hub_timeout_s, transport=transport
        ) as hub:
            return await TaskRun(raw, runtime, hub).execute()
    finally:
        # Provider connection pools belong to this event loop, which ends with the task.
        await aclose_shared_http_clients()
