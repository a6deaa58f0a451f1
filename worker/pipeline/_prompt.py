"""What the model reads at the start of a task: system prompt, budget status, the task.

The thread or the discovery feed, written by others, goes inside the run's
untrusted-content delimiters (``UntrustedBlocks``, ``worker.models``); the system
prompt tells the model what those blocks are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from worker.models import Message, UntrustedBlocks
from worker.pipeline import _discovery
from worker.task import Task, TaskType

if TYPE_CHECKING:
    from hub_client import BudgetHealth, Comment, Post
    from worker.agents import AgentDefinition

_MAX_ITEM_CHARS = 4_000
THREAD_CUT_MARKER = "[… {count} older comment(s) left out to fit the model's context window]"
# Of a bounded context window, what the thread may fill (in estimated characters): half.
THREAD_CHARS_PER_WINDOW_TOKEN = 1.5


def system_prompt(agent: AgentDefinition) -> str:
    """The agent's prompt and skills: the same text in every task of the agent, so a
    provider's prompt cache can keep it. Nothing of the task goes here."""
    return agent.full_system_prompt().strip()


def task_instructions(budget: BudgetHealth | None, blocks: UntrustedBlocks) -> str:
    """What the model reads right after ``system_prompt``: this run's untrusted-content
    notice (its nonce) and the budget line."""
    parts = [blocks.notice()]
    if budget is not None:
        parts.append(budget.summary())
    return "\n\n".join(parts)


def notification_message(
    task: Task,
    thread: Post,
    blocks: UntrustedBlocks,
    *,
    max_chars: int | None = None,
    memory: str = "",
) -> Message:
    lines = [
        f"You were mentioned or replied to on the Hub, in the thread of post {thread.id}.",
        "Read the thread and write your reply to it. Your final answer is posted as your "
        "comment on that post, so write it as the comment itself.",
        "",
        blocks.wrap("thread", _thread_items(thread, max_chars)),
    ]
    if memory:
        lines += ["", memory]
    return Message(role="user", content="\n".join(lines))


def _thread_items(thread: Post, max_chars: int | None) -> list[str]:
    """The post and its comments; within ``max_chars``, the oldest comments give way first."""
    post = _render_post(thread)
    comments = [_render_comment(comment) for comment in thread.comments]
    if max_chars is None:
        return [post, *comments]
    room = max_chars - len(post)
    kept: list[str] = []
    for comment in reversed(comments):
        if len(comment) > room:
            break
        kept.append(comment)
        room -= len(comment)
    left_out = len(comments) - len(kept)
    marker = [THREAD_CUT_MARKER.format(count=left_out)] if left_out else []
    return [post, *marker, *reversed(kept)]


def exploration_message(
    task: Task,
    agent: AgentDefinition,
    feed: Sequence[Post],
    blocks: UntrustedBlocks,
    *,
    memory: str = "",
) -> Message:
    interests = agent.config.interests
    focus = ", ".join([*interests.topics, *interests.keywords]) or "anything relevant to you"
    lines = [
        "You are exploring the Hub on your own. Look at the discovery feed below and use "
        "your tools to search and read where it helps.",
        _discovery.instructions(
            agent.config.behavior.discovery,
            any_post=agent.config.scope.comment_on_any_post,
        ),
        f"Your interests: {focus}.",
        f"Your communities: {', '.join(interests.communities) or 'm/general'}.",
        "",
        blocks.wrap("discovery-feed", [_render_post(post) for post in feed] or ["(empty feed)"]),
    ]
    if memory:
        lines += ["", memory]
    return Message(role="user", content="\n".join(lines))


def first_message(
    task: Task,
    agent: AgentDefinition,
    *,
    thread: Post | None,
    feed: Sequence[Post],
    blocks: UntrustedBlocks,
    memory: str = "",
) -> Message:
    """The task's first message; ``memory`` (a ``worker.memory.memory_block``) follows the
    thread or feed."""
    if task.type is TaskType.NOTIFICATION:
        assert thread is not None, "notification tasks are built with their thread"
        window = agent.config.brain.max_context_tokens
        max_chars = None if window is None else int(window * THREAD_CHARS_PER_WINDOW_TOKEN)
        return notification_message(task, thread, blocks, max_chars=max_chars, memory=memory)
    return exploration_message(task, agent, feed, blocks, memory=memory)


def _render_post(post: Post) -> str:
    when = post.created_at.isoformat() if post.created_at else "unknown time"
    title = f" — {post.title}" if post.title else ""
    community = post.community or "m/general"
    header = f"[post {post.id}] in {community} by {post.author.name or post.author.id} "
    return f"{header}(@{post.author.id}) at {when}{title}\n{_clip(post.content)}"


def _render_comment(comment: Comment) -> str:
    when = comment.created_at.isoformat() if comment.created_at else "unknown time"
    who = comment.author.name or comment.author.id
    header = f"[comment {comment.id}] by {who} (@{comment.author.id}) at {when}"
    return f"{header}\n{_clip(comment.content)}"


def _clip(text: str) -> str:
    if len(text) <= _MAX_ITEM_CHARS:
        return text
    return text[:_MAX_ITEM_CHARS] + f"\n[… {len(text) - _MAX_ITEM_CHARS} more characters]"
