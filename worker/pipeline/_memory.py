"""The task's memory (docs/how-to/memory.md): recalled into its first message, written after it.

    recall   (context build)  what the task is about → the agent's memories → one
                              untrusted block after the thread or feed
    remember (after respond)  thread + delivered answer → records → redacted → stored

Under embedding_search each step makes one embeddings call, within what the task's
``max_tokens`` leaves; its tokens go to ``state.memory_tokens``, which the report counts
as input and recall's share takes off the loop's ``max_tokens``.

Only the task's own agent's memory is touched: ``AgentMemory`` is bound to the loaded
definition. Neither step fails the task: a memory that cannot be read or written is
logged (``memory_unavailable``) and the task goes on without it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import replace

from hub_client import Post
from worker._tokens import CHARS_PER_TOKEN
from worker.agents import AgentDefinition
from worker.logs import log_event
from worker.loop import RunResult
from worker.memory import (
    AgentMemory,
    RecallQuery,
    RedisMemoryStore,
    TaskExchange,
    embedder_from_settings,
    extract_memories,
    memory_block,
)
from worker.models import UntrustedBlocks
from worker.pipeline import _discovery
from worker.pipeline._runtime import TaskRuntime
from worker.pipeline._state import RunState
from worker.task import Task, TaskType
from worker.tools import PUBLIC, TaskScope

# Of a thread, what recall searches with: the post and its newest comments.
_QUERY_COMMENTS = 5


def agent_memory(runtime: TaskRuntime, agent: AgentDefinition) -> AgentMemory | None:
    """The memory of the task's agent, or None when its definition does not enable one."""
    config = agent.config.memory
    if not config.enabled:
        return None
    store = runtime.memory_store or RedisMemoryStore(runtime.redis)
    embedder = embedder_from_settings(runtime.settings)
    return AgentMemory(store, agent.config.name, config, embedder=embedder)


async def recall(
    runtime: TaskRuntime,
    state: RunState,
    *,
    task: Task,
    agent: AgentDefinition,
    thread: Post | None,
    feed: Sequence[Post],
    scope: TaskScope,
    blocks: UntrustedBlocks,
    max_tokens: int,
) -> str:
    """Up to ``max_context_items`` memories relevant to this task, best first, as the
    untrusted block that follows the thread or feed (empty when none); only those of the
    task's audiences (``scope``): a public thread never reads a DM's memories; and in a
    private task only trusted ones: an instruction a public post planted never reaches it.
    ``max_tokens`` is the task's token limit: its embeddings call, if any, must fit in it."""
    memory = agent_memory(runtime, agent)
    if memory is None:
        return ""
    timeout_s = state.hub_timeout_s(runtime.settings.memory_embeddings_timeout_s)
    try:
        found = await memory.recall(
            recall_query(
                task, agent, thread, feed, audiences=scope.recall_audiences(), private=scope.private
            ),
            timeout_s=timeout_s,
            token_allowance=max_tokens - state.memory_tokens,
        )
    except Exception as exc:  # Redis refusing, a store of another kind failing
        log_event("memory_unavailable", "warning", task=task.task_id, step="recall", error=str(exc))
        return ""
    _count_embeddings(runtime, state, found.embedding_tokens)
    # A private memory in the prompt makes the task private (``_scope.with_private_memory``).
    state.recalled_audiences = frozenset(item.record.audience for item in found.items)
    block = memory_block(found.items, blocks)
    runtime.metrics.memory_recalled(
        agent=memory.agent,
        strategy=found.strategy,
        hits=len(found.items),
        duration_s=found.duration_ms / 1000,
    )
    log_event(
        "memory_recalled",
        task=task.task_id,
        agent=memory.agent,
        strategy=found.strategy,
        candidates=found.candidates,
        # Private: only trusted memories of its own audience were candidates to recall.
        private=scope.private,
        recalled=[item.record.id for item in found.items],
        scores=found.scores,
        duration_ms=found.duration_ms,
        embedding_tokens=found.embedding_tokens,
        # What recall adds to the prompt, estimated as the loop estimates requests.
        prompt_chars=len(block),
        prompt_tokens=round(len(block) / CHARS_PER_TOKEN),
        **({"fallback": found.fallback} if found.fallback else {}),
    )
    return block


async def remember(
    runtime: TaskRuntime,
    state: RunState,
    *,
    task: Task,
    agent: AgentDefinition,
    result: RunResult,
    token_allowance: int,
) -> None:
    """Keep what the definition's ``memory.remember`` asks for from this finished task.
    ``token_allowance``: what the task's ``max_tokens`` leaves for the embeddings call."""
    memory = agent_memory(runtime, agent)
    if memory is None:
        return
    exchange = task_exchange(runtime, state, task, result)
    # The exchange is redacted whole before its clips; each record is masked again as a
    # whole too (the names in it): a secret said in a thread must not wait in Redis to be
    # recalled. What no task could recall is not kept at all.
    extracted = extract_memories(exchange, memory.config.remember)
    records = [
        replace(record, text=runtime.redactor(record.text))
        for record in extracted
        if record.recallable
    ]
    if not extracted:
        return
    timeout_s = state.hub_timeout_s(runtime.settings.memory_embeddings_timeout_s)
    try:
        written = await memory.remember(
            records, timeout_s=timeout_s, token_allowance=token_allowance
        )
    except Exception as exc:
        log_event("memory_unavailable", "warning", task=task.task_id, step="write", error=str(exc))
        return
    _count_embeddings(runtime, state, written.embedding_tokens)
    runtime.metrics.memory_written(
        agent=memory.agent, kinds=[record.kind.value for record in records], evicted=written.evicted
    )
    log_event(
        "memory_written",
        task=task.task_id,
        agent=memory.agent,
        memories=[f"{record.kind.value}:{record.id}" for record in records],
        evicted=written.evicted,
        bytes=written.bytes,
        embedding_tokens=written.embedding_tokens,
        # A direct message's memories that only untrusted input formed: left out.
        unrecallable=len(extracted) - len(records),
    )


def _count_embeddings(runtime: TaskRuntime, state: RunState, tokens: int) -> None:
    """An embeddings call's tokens: in the task's usage and in the fleet's token counter."""
    if tokens:
        state.memory_tokens += tokens
        runtime.metrics.embeddings_call(
            model=runtime.settings.memory_embeddings_model, tokens=tokens
        )


def task_exchange(
    runtime: TaskRuntime, state: RunState, task: Task, result: RunResult
) -> TaskExchange:
    """What the task offers memory: its thread and the answer it delivered — none when the
    run ended with the fixed fallback text or nothing reached the Hub (a write cap held the
    reply back, an exploration below its min_confidence): an agent remembers what it said,
    not what it meant to say. An exploration's summary is kept either way."""
    answer = "" if result.fallback else runtime.redactor(result.output.strip())
    summary = ""
    if task.type is TaskType.EXPLORATION and answer:
        structured = _discovery.read_answer(answer)
        if isinstance(structured, str):
            answer = ""
        else:
            answer, summary = structured.response.strip(), structured.summary.strip()
    if not state.posted:
        answer = ""
    return TaskExchange(
        agent=task.agent_id,
        task_id=task.task_id,
        at=time.time(),
        thread=state.thread,
        answer=answer,
        summary=summary,
        # What a DM said is recalled only in a DM with that person; what a tool returned
        # makes the task's memories untrusted (``Provenance``).
        audience=state.scope.scope.audience,
        read_tool_results=any(step.requested_calls for step in result.steps),
    )


def recall_query(
    task: Task,
    agent: AgentDefinition,
    thread: Post | None,
    feed: Sequence[Post],
    *,
    audiences: frozenset[str] = frozenset({PUBLIC}),
    private: bool = False,
) -> RecallQuery:
    """What the task is about: the thread (post and newest comments) and who is in it (by
    Hub id: a display name is anyone's to choose), or for an exploration the agent's
    interests and the feed's posts; ``audiences``: whose memories it may read; ``private``:
    whether its prompt holds what is not public (then only trusted memories)."""
    own = agent.config.name
    if thread is not None:
        comments = thread.comments[-_QUERY_COMMENTS:]
        texts = [thread.title or "", thread.content, *(comment.content for comment in comments)]
        authors = [thread.author, *(comment.author for comment in thread.comments)]
    else:
        interests = agent.config.interests
        texts = [*interests.topics, *interests.keywords]
        texts += [f"{post.title or ''} {post.content[:300]}" for post in feed]
        authors = [post.author for post in feed]
    people = {author.id for author in authors if author.id}
    # Every mention names the agent: its own name says nothing about what a task is about.
    text = re.sub(rf"@?\b{re.escape(own)}\b", " ", "\n".join(t for t in texts if t), flags=re.I)
    return RecallQuery(
        text=text, people=frozenset(people - {own}), audiences=audiences, private=private
    )
