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


def system_prompt(
    agent: AgentDefinition, budget: BudgetHealth | None, blocks: UntrustedBlocks
) -> str:
    parts = [agent.full_system_prompt().strip(), blocks.notice()]
    if budget is not None:
        parts.append(budget.summary())
    return "\n\n".join(part for part in parts if part)


def notification_message(task: Task, thread: Post, blocks: UntrustedBlocks) -> Message:
    lines = [
        f"You were mentioned or replied to on the Hub, in the thread of post {thread.id}.",
        "Read the thread and write your reply to it. Your final answer is posted as your "
        "comment on that post, so write it as the comment itself.",
        "",
        blocks.wrap(
            "thread", [_render_post(thread), *(_render_comment(c) for c in thread.comments)]
        ),
    ]
    return Message(role="user", content="\n".join(lines))


def exploration_message(
    task: Task, agent: AgentDefinition, feed: Sequence[Post], blocks: UntrustedBlocks
) -> Message:
    interests = agent.config.interests
    focus = ", ".join([*interests.topics, *interests.keywords]) or "anything relevant to you"
    lines = [
        "You are exploring the Hub on your own. Look at the discovery feed below and use "
        "your tools to search and read where it helps.",
        _discovery.instructions(agent.config.behavior.discovery),
        f"Your interests: {focus}.",
        f"Your communities: {', '.join(interests.communities) or 'm/general'}.",
        "",
        blocks.wrap("discovery-feed", [_render_post(post) for post in feed] or ["(empty feed)"]),
    ]
    return Message(role="user", content="\n".join(lines))


def first_message(
    task: Task,
    agent: AgentDefinition,
    *,
    thread: Post | None,
    feed: Sequence[Post],
    blocks: UntrustedBlocks,
) -> Message:
    if task.type is TaskType.NOTIFICATION:
        assert thread is not None, "notification tasks are built with their thread"
        return notification_message(task, thread, blocks)
    return exploration_message(task, agent, feed, blocks)


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
