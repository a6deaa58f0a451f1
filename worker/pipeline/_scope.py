"""The task's scope (``worker.tools._scope``), from trusted inputs only.

    task as enqueued  →  type, post_id, notification_type
    definition        →  discovery's respond_to_* and post_final, interests.communities,
                         the scope opt-ins
    the Hub's answers →  the notified post's author (whose DM it is), the feed's post ids,
                         both read by the worker before the model runs

Nothing the model reads or says enters it: it is fixed before the first model call.
"""

from __future__ import annotations

from collections.abc import Sequence

from hub_client import Post
from worker.agents import AgentDefinition
from worker.pipeline import _discovery
from worker.task import Task, TaskType
from worker.tools import ANY_COMMUNITY, PUBLIC, TaskScope, dm_audience

# The notification kind that makes a task a direct message's answer.
DM = "dm"
# Where an exploration's summary goes when the agent names no community of its own.
DEFAULT_COMMUNITY = "m/general"


def task_scope(
    task: Task, agent: AgentDefinition, *, thread: Post | None, feed: Sequence[Post]
) -> TaskScope:
    """Where this task may write: its narrow default, widened by the definition's opt-ins."""
    config = agent.config
    opt_ins = config.scope
    if task.type is TaskType.NOTIFICATION:
        assert task.post_id is not None  # a notification names its post (Task validates)
        comment_on: frozenset[str] = frozenset({task.post_id})
        post_in: frozenset[str] = frozenset()
        reply_to: str | None = task.post_id
    else:
        discovery = config.behavior.discovery
        responds = bool(_discovery.allowed_kinds(discovery))
        comment_on = frozenset(post.id for post in feed) if responds else frozenset()
        own = config.interests.communities or [DEFAULT_COMMUNITY]
        post_in = frozenset(own) if discovery.post_final else frozenset()
        reply_to = None
    return TaskScope(
        comment_on=None if opt_ins.comment_on_any_post else comment_on,
        post_in=None if ANY_COMMUNITY in opt_ins.post_in else post_in | set(opt_ins.post_in),
        reply_to=reply_to,
        audience=_audience(task, agent, thread),
        widened=tuple(opt_ins.widened),
    )


def _audience(task: Task, agent: AgentDefinition, thread: Post | None) -> str:
    """``dm:<person>`` for a direct message's answer (the other side of the conversation,
    as the Hub names its authors), else public."""
    if task.notification_type != DM:
        return PUBLIC
    own = agent.config.name.lower()
    authors = [] if thread is None else [thread.author, *(c.author for c in thread.comments)]
    others = [author.id for author in authors if author.id.lower() != own]
    # Whose DM it is cannot be told: one of its own, shared with no other DM.
    return dm_audience(others[0] if others else f"post-{task.post_id}")
