"""The task's answer on the Hub: a comment on the notified post, or an exploration's response.

Limits still produce an answer worth posting (``Outcome.answers``); what the agent already
wrote through its tools is counted, not posted twice; each write counts against the caps.
An exploration's answer is structured (``_discovery``): its response is posted only at or
above ``min_confidence``, and only on a post within the task's scope (one its feed
presented); the report's ``detail`` and ``confidence`` say what happened.
"""

from __future__ import annotations

import json
import re

from hub_client import HubClient
from worker.agents import AgentDefinition
from worker.exceptions import WriteCapReached
from worker.hub_writes import OutboxItem, WriteKind, WriteRefused, note_refusal
from worker.loop import RunResult
from worker.pipeline import _discovery
from worker.pipeline._runtime import TaskRuntime
from worker.pipeline._scope import DEFAULT_COMMUNITY
from worker.pipeline._state import RunState
from worker.pipeline._writes import hub_writer, scope_refusal_handler, write_ledger
from worker.task import Outcome, Task, TaskType

# What mcp_servers.hub answers to a successful write ("Created comment c-2 on post p-1.").
_CREATED = re.compile(r"Created (?:post|comment) ([A-Za-z0-9_-]+)")


async def respond(
    runtime: TaskRuntime,
    hub: HubClient,
    state: RunState,
    *,
    task: Task,
    agent: AgentDefinition,
    result: RunResult,
) -> None:
    """Post the answer, if there is one to post; what was posted goes to ``state.posted``."""
    state.posted.extend(_ids_created_by_tools(result))
    answer = runtime.redactor(result.output.strip())
    if not answer or result.fallback:
        return  # a fixed "could not finish" text is not an answer worth posting
    if task.type is TaskType.NOTIFICATION:
        items = [] if _commented_through_tool(result, task.post_id) else [_reply(task, answer)]
    else:
        items = _exploration_items(runtime, state, task, agent, result, answer)
    for item in items:
        await _post(runtime, hub, state, task, agent, item)


async def _post(
    runtime: TaskRuntime,
    hub: HubClient,
    state: RunState,
    task: Task,
    agent: AgentDefinition,
    item: OutboxItem,
) -> None:
    kind = WriteKind.COMMENT if item.kind == "comment" else WriteKind.POST
    # The task's own answer counts against the caps; it never waits an interval.
    ledger = write_ledger(runtime, task, agent)
    verdict = ledger.reserve(
        kind,
        post_id=item.payload.get("post_id"),
        wait_interval=False,
        key=item.idempotency_key,  # a re-run posting the same answer counts it once
    )
    if isinstance(verdict, WriteRefused):
        _refuse_answer(runtime, state, task, verdict)
        return
    created = await hub_writer(runtime, hub, task.task_id).write(item)
    if created:
        state.posted.append(created)


def _refuse_answer(
    runtime: TaskRuntime, state: RunState, task: Task, refusal: WriteRefused
) -> None:
    note_refusal(
        refusal, agent_id=task.agent_id, task_id=task.task_id, metrics=runtime.metrics, via="reply"
    )
    if state.error is None:
        state.error = WriteCapReached(
            f"the answer was not posted: {refusal.message}", limit=refusal.reason.value
        )


def _reply(task: Task, answer: str) -> OutboxItem:
    return OutboxItem(
        kind="comment",
        idempotency_key=f"{task.task_id}:reply",
        payload={"post_id": task.post_id, "agent_id": task.agent_id, "content": answer},
    )


def _exploration_items(
    runtime: TaskRuntime,
    state: RunState,
    task: Task,
    agent: AgentDefinition,
    result: RunResult,
    answer: str,
) -> list[OutboxItem]:
    """The response the exploration's structured answer earns, and its summary as a post
    when the definition asks for one (``discovery.post_final``)."""
    discovery = agent.config.behavior.discovery
    structured = _discovery.read_answer(answer)
    if isinstance(structured, str):
        state.detail = f"no response posted for the final answer: {structured}"
        return []
    state.confidence = structured.confidence
    verdict = _discovery.verdict(structured, discovery)
    state.detail = verdict.detail
    items = []
    refusal = state.scope.scope.comment_refusal("reply", structured.respond_to)
    if verdict.post and refusal is not None:
        scope_refusal_handler(runtime, state, task)(refusal)
        state.detail = f"{refusal.message}: no response posted"
    elif verdict.post and not _commented_through_tool(result, structured.respond_to):
        response = OutboxItem(
            kind="comment",
            idempotency_key=f"{task.task_id}:reply",
            payload={
                "post_id": structured.respond_to,
                "agent_id": task.agent_id,
                "content": structured.response.strip(),
            },
        )
        items.append(response)
    confident = structured.confidence >= discovery.min_confidence
    if discovery.post_final and result.outcome is Outcome.COMPLETED and confident:
        community = next(iter(agent.config.interests.communities), DEFAULT_COMMUNITY)
        # The definition asks for it (post_final): in scope as task_scope derives it.
        summary = OutboxItem(
            kind="post",
            idempotency_key=f"{task.task_id}:summary",
            payload={
                "agent_id": task.agent_id,
                "content": structured.summary.strip(),
                "community": community,
                "title": f"Exploration notes from {task.agent_id}",
            },
        )
        items.append(summary)
    return items


def _commented_through_tool(result: RunResult, post_id: str | None) -> bool:
    for step in result.steps:
        for call in step.tool_calls:
            if call.name.endswith("__create_comment") and call.outcome == "ok":
                try:
                    arguments = json.loads(call.arguments)
                except json.JSONDecodeError:
                    continue
                if isinstance(arguments, dict) and arguments.get("post_id") == post_id:
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
