"""The ending of a task, on every path: the report, the Hub's side, metrics and logs.

report → settle (read mark, consumption, activation, error post, journal and control
cleared) → finish (metrics, task_failed/task_completed) → drain older outbox items.
None of these raise for what the Hub or Redis answer: the report always comes back.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from hub_client import HubClient
from worker.coordination import RedisJournal, clear_control, forget_task_deadline
from worker.exceptions import error_payload
from worker.hub_writes import HubWriter, OutboxItem, drain
from worker.logs import log_event
from worker.loop import RunResult
from worker.pipeline._runtime import TaskRuntime
from worker.pipeline._state import RunState
from worker.pipeline._writes import hub_writer
from worker.task import AgentReport, ErrorInfo, Outcome, RefusedWrite, Task, raw_field

ERRORS_COMMUNITY = "m/agent-errors"
# The agent and type label of a task that never became valid: one series, not one per id.
INVALID_LABEL = "invalid"
# Of rq's grace after the deadline (JOB_TIMEOUT_GRACE_S): what delivering older outbox items
# may take, after the settling's own writes.
_DRAIN_SHARE_OF_GRACE = 0.2
_DRAIN_LIMIT = 20
_DRAIN_TIMEOUT_S = 5.0


def build_report(
    runtime: TaskRuntime, state: RunState, *, raw: Any, task_id: str, started: float
) -> AgentReport:
    """The AgentReport of the run so far; fields of a task that never parsed come from ``raw``."""
    task, result = state.task, state.result
    run = result.state if result else None
    usage = run.usage if run else None
    return AgentReport(
        task_id=task.task_id if task else task_id,
        agent_id=task.agent_id if task else str(raw_field(raw, "agent_id") or ""),
        type=task.type.value if task else str(raw_field(raw, "type") or ""),
        outcome=state.outcome,
        output=runtime.redactor(result.output) if result else "",
        iterations=run.iterations if run else 0,
        llm_calls=run.llm_calls if run else 0,
        tool_calls=run.tool_calls if run else 0,
        # The memory's embeddings calls are model spend too: never a second, hidden one.
        tokens_input=(usage.input_tokens if usage else 0) + state.memory_tokens,
        tokens_output=usage.output_tokens if usage else 0,
        tokens_cache_read=usage.cache_read_tokens if usage else 0,
        tokens_cache_write=usage.cache_write_tokens if usage else 0,
        cost_usd=usage.cost_usd if usage else 0.0,
        duration_s=round(time.monotonic() - started, 3),
        posted=state.posted,
        error=_error_info(runtime, state.error),
        detail=state.detail,
        confidence=state.confidence,
        refused_writes=[
            RefusedWrite(
                tool=refusal.tool,
                reason=refusal.reason.value,
                target=runtime.redactor(refusal.target),
            )
            for refusal in state.refused_writes
        ],
    )


def _error_info(runtime: TaskRuntime, error: BaseException | None) -> ErrorInfo | None:
    if error is None:
        return None
    payload = error_payload(error)
    return ErrorInfo.model_validate(
        {"class": payload["class"], "message": runtime.redactor(payload["message"])}
    )


async def settle(
    runtime: TaskRuntime, hub: HubClient, state: RunState, report: AgentReport
) -> None:
    """The Hub side of the ending; never raises, whatever the Hub (or Redis) answers.

    The closing writes do not depend on one another, so they go to the Hub at once: the
    task pays for the slowest, not for the sum. Each still goes through the outbox on its
    own (sent, parked or dead-lettered under its own idempotency key).
    """
    task, agent = state.task, state.agent
    final = report.outcome is not Outcome.REQUEUED
    writer = hub_writer(runtime, hub, report.task_id)
    try:
        async with anyio.create_task_group() as writes:
            if task is not None and agent is not None and final:
                for item in _close_out_items(task, report):
                    writes.start_soon(writer.write, item)
            # Failed outcomes, tool loops, and a task given up after its last requeue.
            if report.outcome.posts_error or state.given_up:
                writes.start_soon(_post_error, runtime, writer, state, report)
        if task is not None and final:
            RedisJournal(runtime.redis, task.task_id).clear()
            clear_control(runtime.redis, task.task_id)
            forget_task_deadline(runtime.redis, task.task_id)
    except Exception as exc:  # the report, metrics and task_completed still follow
        log_event("settle_failed", "error", task=report.task_id, error=str(exc))


def _close_out_items(task: Task, report: AgentReport) -> list[OutboxItem]:
    """The read mark (for a notification), the consumption record and the activation.

    A skipped task only marks its notification read: the agent did not act.
    """
    items = []
    if task.notification_id and report.outcome is not Outcome.INVALID_TASK:
        items.append(
            OutboxItem(
                kind="notifications_read",
                idempotency_key=f"{task.task_id}:read",
                payload={"notification_ids": [task.notification_id]},
            )
        )
    if report.outcome is Outcome.SKIPPED:
        return items
    cost = report.cost_usd
    items.append(
        OutboxItem(
            kind="consumption",
            idempotency_key=f"{task.task_id}:consumption",
            payload={
                "agent_id": task.agent_id,
                "tokens_input": report.tokens_input,
                "tokens_output": report.tokens_output,
                "tokens_cache_read": report.tokens_cache_read,
                "tokens_cache_write": report.tokens_cache_write,
                "cost_usd": cost or 0.0,
                "cost_known": cost is not None,
                "activation_id": task.task_id,
                "task_type": task.type.value,
                "duration_seconds": report.duration_s,
                "outcome": report.outcome.value,
            },
        )
    )
    items.append(
        OutboxItem(
            kind="activated",
            idempotency_key=f"{task.task_id}:activated",
            payload={"agent_id": task.agent_id},
        )
    )
    return items


async def _post_error(
    runtime: TaskRuntime, writer: HubWriter, state: RunState, report: AgentReport
) -> None:
    author = state.agent.config.name if state.agent else runtime.settings.errors_agent_id
    content = runtime.redactor(error_post_content(report, state.result, state.error))
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
    runtime.metrics.error_posted()
    if created:
        log_event("error_posted", task=report.task_id, post=created)


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


def finish(runtime: TaskRuntime, state: RunState, report: AgentReport) -> None:
    """Metrics and the closing log lines: on every path, exactly once."""
    # Only agents that loaded and types that parsed label metrics.
    agent_label = state.agent.config.name if state.agent is not None else INVALID_LABEL
    type_label = state.task.type.value if state.task is not None else INVALID_LABEL
    runtime.metrics.task_finished(
        agent=agent_label,
        task_type=type_label,
        outcome=report.outcome.value,
        duration_s=report.duration_s,
        iterations=report.iterations,
        cost_usd=report.cost_usd,
    )
    fields = _report_fields(report) | {"attempt": runtime.attempt}
    if report.outcome.fails_job:
        log_event(
            "task_failed",
            "error",
            **fields,
            error=report.error.model_dump(by_alias=True) if report.error else None,
            code=getattr(state.error, "code", "error"),
            severity=str(getattr(state.error, "severity", "error")),
        )
    log_event("task_completed", **fields)


def _report_fields(report: AgentReport) -> dict[str, Any]:
    return {
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
        "tokens_cache_read": report.tokens_cache_read,
        "tokens_cache_write": report.tokens_cache_write,
        "cost_usd": report.cost_usd,
        "posted": report.posted,
    }


async def drain_outbox(runtime: TaskRuntime, hub: HubClient) -> None:
    """Deliver older parked writes while the Hub client is open; never fails the task."""
    settings = runtime.settings
    try:
        # Cut short, a claimed item just waits out its lease and is tried again.
        with anyio.move_on_after(settings.job_timeout_grace_s * _DRAIN_SHARE_OF_GRACE):
            await drain(
                runtime.redis,
                hub,
                limit=_DRAIN_LIMIT,
                timeout_s=_DRAIN_TIMEOUT_S,
                max_attempts=settings.outbox_max_attempts,
                on_dead_letter=runtime.metrics.dead_letter,
            )
    except Exception as exc:
        log_event("outbox_drain_failed", "warning", error=str(exc))
