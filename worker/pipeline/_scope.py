"""The task's scope (``worker.tools._scope``), from trusted inputs only.

    task as enqueued  →  type, post_id, notification_type
    definition        →  discovery's respond_to_* and post_final, interests.communities,
                         the scope opt-ins, scope.private
    operator          →  PRIVATE_AGENTS, EGRESS_ALLOW, UNMARKED_POSTS
    the Hub's answers →  the notified post's author (whose DM it is) and visibility, the
                         feed's post ids, all read by the worker before the model runs

Private (its reads bounded by ``Reach``) when the prompt holds what is not public: a post
the Hub does not call public (fail closed: one it says nothing about is private unless the
operator says unmarked posts are public), a task labelled ``dm``, an agent the definition or
the operator marks private, and (``with_private_memory``, after recall) a recalled memory
of a private audience. The label alone never makes a direct message public.

Nothing the model reads or says enters it: it is fixed before the first model call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hub_client import Post
from worker.agents import AgentDefinition
from worker.pipeline import _discovery
from worker.settings import Settings
from worker.task import Task, TaskType
from worker.tools import ANY_COMMUNITY, PUBLIC, Reach, TaskScope, dm_audience, urls_in

# The notification kind that makes a task a direct message's answer.
DM = "dm"
# Where an exploration's summary goes when the agent names no community of its own.
DEFAULT_COMMUNITY = "m/general"
ALL_AGENTS = "*"


@dataclass(frozen=True, kw_only=True)
class EgressPolicy:
    """The operator's levers on private tasks (``Settings``: PRIVATE_AGENTS, EGRESS_ALLOW,
    UNMARKED_POSTS)."""

    allow: tuple[str, ...] = ()
    private_agents: frozenset[str] = frozenset()
    unmarked_public: bool = False

    @classmethod
    def of(cls, settings: Settings) -> EgressPolicy:
        return cls(
            allow=tuple(settings.egress_allow),
            private_agents=frozenset(settings.private_agents),
            unmarked_public=settings.unmarked_posts == PUBLIC,
        )

    def marks_private(self, agent: AgentDefinition) -> str | None:
        """Why every task of ``agent`` is private, or None."""
        if agent.config.scope.private:
            return "definition"
        if ALL_AGENTS in self.private_agents or agent.config.name in self.private_agents:
            return "operator"
        return None


# No operator lever set: unmarked posts private, no allowlist, no agent private.
NO_LEVERS = EgressPolicy()


def task_scope(
    task: Task,
    agent: AgentDefinition,
    *,
    thread: Post | None,
    feed: Sequence[Post],
    egress: EgressPolicy = NO_LEVERS,
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
    not_public = _not_public(task, thread, egress)
    person = _person(task, agent, thread)
    reasons = [reason for reason in (not_public, egress.marks_private(agent)) if reason]
    # The person's links are kept in a public task too: a private memory recalled later
    # makes it private (``with_private_memory``), and they still count.
    urls = _urls_of(person, thread) if person is not None else []
    reach = Reach(
        private=bool(reasons), urls=frozenset(urls), allow=egress.allow, reasons=tuple(reasons)
    )
    return TaskScope(
        comment_on=None if opt_ins.comment_on_any_post else comment_on,
        post_in=None if ANY_COMMUNITY in opt_ins.post_in else post_in | set(opt_ins.post_in),
        reply_to=reply_to,
        # What a DM (or a thread not known to be public) said is recalled only with its person.
        audience=PUBLIC if not_public is None else dm_audience(person or f"post-{task.post_id}"),
        reach=reach,
        widened=tuple(opt_ins.widened),
    )


def with_private_memory(
    scope: TaskScope, audiences: Iterable[str], egress: EgressPolicy
) -> TaskScope:
    """``scope``, private when recall put a memory of a private audience into the prompt."""
    if all(audience == PUBLIC for audience in audiences):
        return scope
    return replace(scope, reach=scope.reach.made_private("private memory"))


def _not_public(task: Task, thread: Post | None, egress: EgressPolicy) -> str | None:
    """Why the notified thread is not public, from what the Hub said; None when it is."""
    if thread is None:
        return None
    public = thread.is_public
    if public is False:
        return f"visibility {thread.visibility}"
    if task.notification_type == DM:
        return "direct message"
    if public is None and not egress.unmarked_public:
        return "visibility unknown"
    return None


def _person(task: Task, agent: AgentDefinition, thread: Post | None) -> str | None:
    """Who the task answers: the other side of the conversation, as the Hub names its
    authors (the first author in the thread who is not the agent); None without a thread."""
    if thread is None:
        return None
    # Exact ids: on a Hub whose ids are case-sensitive, `Eve` is not `eve`.
    own = agent.config.name
    authors = [thread.author, *(c.author for c in thread.comments)]
    others = [author.id for author in authors if author.id != own]
    # Whose DM it is cannot be told: None, and the audience is one of its own.
    return others[0] if others else None


def _urls_of(person: str, thread: Post | None) -> list[str]:
    """The links the person's own words in the thread give: its post if theirs, their
    comments; never what anyone else wrote there."""
    if thread is None:
        return []
    texts = [thread.title or "", thread.content] if thread.author.id == person else []
    texts += [c.content for c in thread.comments if c.author.id == person]
    return [url for text in texts for url in urls_in(text)]
