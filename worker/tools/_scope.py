"""A task's scope: where this task's writes may go, fixed from trusted inputs only.

A grant says which tools an agent may ever use; the scope says where, for this task.
The worker derives it from the task as the Hub enqueued it, the agent's definition and
the operator's configuration, before the model runs (``worker.pipeline._scope``), so
nothing the model reads (threads, feeds, tool results, memories) can widen it::

    notification   comment on the notified post only: its reply, made once
                   (no new post, no comment elsewhere, no second reply)
    exploration    comment on the posts its feed presented, if discovery.respond_to_*
                   lets it respond; post in its own communities only with
                   discovery.post_final
    audience       "public", or "dm:<person>" for a direct message (the person's exact
                   Hub id): memories formed in a DM are recalled only in a DM with the
                   same person, and a private task recalls only trusted ones
    reach          where a private task's reads may go (``worker.tools._reach``); a
                   public task's reads go anywhere, as before

Anything wider is a named opt-in (``TaskScope.widened`` names them). The scope travels
in the task's signed capability (claim ``scope``, ``to_claim``/``from_claim``), so our
MCP servers refuse an out-of-scope write themselves, whoever sent it; the worker refuses
it first (``ScopedToolbox``). A refusal's message names only what the worker knows from
trusted inputs, never the model's arguments: an injected text is not echoed back.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from worker.tools._reach import Reach, origin_of

PUBLIC = "public"
DM_PREFIX = "dm:"
# A community the Hub picks when a post names none: a post must name one in scope.
_NO_COMMUNITY = ""
# What of a refused target the report keeps (the model chose it; it may be anything).
TARGET_CHARS = 120
# Placeholders an operator's argument rule may list: what this task may write to.
POSTS_IN_SCOPE = "$posts"
COMMUNITIES_IN_SCOPE = "$communities"
ANY = "*"


class ScopeReason(StrEnum):
    """Why a write was out of the task's scope (a label of the report's refusals)."""

    COMMENT_ELSEWHERE = "comment_elsewhere"
    POST_NOT_ALLOWED = "post_not_allowed"
    POST_ELSEWHERE = "post_elsewhere"
    ARGUMENT_NOT_ALLOWED = "argument_not_allowed"
    # A private task's read aimed where no trusted input points (``Reach``).
    EGRESS_NOT_ALLOWED = "egress_not_allowed"
    # A private task called a third-party tool that has no argument rule.
    WITHHELD_IN_PRIVATE = "withheld_in_private"

    @property
    def is_egress(self) -> bool:
        return self in (ScopeReason.EGRESS_NOT_ALLOWED, ScopeReason.WITHHELD_IN_PRIVATE)


@dataclass(frozen=True, kw_only=True)
class ScopeRefusal:
    """A write the scope held back: ``message`` is what the model reads (trusted text only);
    ``target`` is what the call aimed at, clipped, for the report and the log."""

    tool: str
    reason: ScopeReason
    message: str
    target: str = ""


def dm_audience(person: str) -> str:
    """The audience of a direct message with ``person``, keyed by their exact Hub id: ids
    may differ only in case (``Eve`` is not ``eve``), so nothing is folded or stripped, and
    anything beyond letters, digits and ``-._~`` is percent-encoded (one id, one key)."""
    return f"{DM_PREFIX}{quote(person, safe='')}"


@dataclass(frozen=True, kw_only=True)
class TaskScope:
    """Where one task may write. ``comment_on``/``post_in`` None: anywhere (an opt-in);
    empty: nowhere. ``reply_to``: the notified post, whose comment is the task's one reply."""

    comment_on: frozenset[str] | None = frozenset()
    post_in: frozenset[str] | None = frozenset()
    reply_to: str | None = None
    audience: str = PUBLIC
    reach: Reach = field(default_factory=Reach.anywhere)
    # The definition's opt-ins that made it wider than the narrow default, by name.
    widened: tuple[str, ...] = ()

    @classmethod
    def nothing(cls) -> TaskScope:
        """No write at all: the scope of a task whose context is not read yet."""
        return cls()

    # -- the Hub's write tools ---------------------------------------------------------

    def comment_refusal(self, tool: str, post_id: object) -> ScopeRefusal | None:
        if self.comment_on is None or (isinstance(post_id, str) and post_id in self.comment_on):
            return None
        if self.reply_to is not None:
            message = (
                f"out of scope: this task answers post {self.reply_to} and may comment only "
                "there; reply in that thread, or in your final answer"
            )
        elif self.comment_on:
            message = "out of scope: this task may comment only on the posts its feed presented"
        else:
            message = "out of scope: this task may not comment"
        return ScopeRefusal(
            tool=tool, reason=ScopeReason.COMMENT_ELSEWHERE, message=message, target=_clip(post_id)
        )

    def post_refusal(self, tool: str, community: object) -> ScopeRefusal | None:
        where = community if isinstance(community, str) else _NO_COMMUNITY
        if self.post_in is None or (where and where in self.post_in):
            return None
        if not self.post_in:
            reason, message = ScopeReason.POST_NOT_ALLOWED, "out of scope: this task may not post"
        else:
            allowed = ", ".join(sorted(self.post_in))
            reason = ScopeReason.POST_ELSEWHERE
            message = f"out of scope: this task may post only in {allowed}"
        return ScopeRefusal(tool=tool, reason=reason, message=message, target=_clip(community))

    def hub_refusal(self, tool: str, arguments: Mapping[str, Any]) -> ScopeRefusal | None:
        """Why a call of our hub server's ``tool`` is out of scope; None when it is in (or
        ``tool`` does not write)."""
        if tool == "create_comment":
            return self.comment_refusal(tool, arguments.get("post_id"))
        if tool == "create_post":
            return self.post_refusal(tool, arguments.get("community"))
        return None

    def is_reply(self, post_id: object) -> bool:
        """Whether a comment on ``post_id`` is the task's reply (made once, keyed as such)."""
        return self.reply_to is not None and post_id == self.reply_to

    # -- reads that leave: a private task's egress -----------------------------------------

    def fetch_refusal(self, tool: str, url: object) -> ScopeRefusal | None:
        """Why a fetch of ``url`` may not leave; None when it may (always, when public)."""
        if isinstance(url, str) and self.reach.allows(url):
            return None
        return ScopeRefusal(
            tool=tool,
            reason=ScopeReason.EGRESS_NOT_ALLOWED,
            message=self.reach.refusal_message(),
            target=_clip(origin_of(url)),
        )

    def withheld(self, tool: str) -> ScopeRefusal | None:
        """A third-party tool without an argument rule: withheld from a private task."""
        if not self.reach.private:
            return None
        return ScopeRefusal(
            tool=tool,
            reason=ScopeReason.WITHHELD_IN_PRIVATE,
            message=(
                "out of reach: this task holds private data, and the operator has not "
                f"allowed {tool} in such tasks"
            ),
        )

    # -- third-party tools: the operator's argument rules --------------------------------

    def allowed_values(self, allow: Collection[str]) -> frozenset[str] | None:
        """What a rule's ``allow`` list permits for this task; None: any value."""
        values: set[str] = set()
        for entry in allow:
            if entry == ANY:
                return None
            if entry in (POSTS_IN_SCOPE, COMMUNITIES_IN_SCOPE):
                bound = self.comment_on if entry == POSTS_IN_SCOPE else self.post_in
                if bound is None:
                    return None
                values |= bound
            else:
                values.add(entry)
        return frozenset(values)

    # -- memory ------------------------------------------------------------------------

    def recall_audiences(self) -> frozenset[str]:
        """Whose memories this task may read: public ones, and its own DM's."""
        return frozenset({PUBLIC, self.audience})

    @property
    def private(self) -> bool:
        """Whether the task's prompt holds what is not public (a direct message's audience,
        or a task the reach marks private): its recall admits only memories formed from
        trusted input (``worker.memory``)."""
        return self.audience != PUBLIC or self.reach.private

    # -- the capability claim ----------------------------------------------------------

    def to_claim(self) -> dict[str, Any]:
        return {
            "comment_on": ANY if self.comment_on is None else sorted(self.comment_on),
            "post_in": ANY if self.post_in is None else sorted(self.post_in),
            "reply_to": self.reply_to,
            "audience": self.audience,
            "egress": self.reach.to_claim(),
        }

    @classmethod
    def from_claim(cls, claim: object) -> TaskScope:
        """The scope a capability carries; ValueError for a claim that is not one."""
        if not isinstance(claim, dict):
            raise ValueError("the scope claim is not an object")
        reply_to = claim.get("reply_to")
        audience = claim.get("audience")
        if reply_to is not None and not isinstance(reply_to, str):
            raise ValueError("the scope's reply_to is not a string")
        if not isinstance(audience, str) or not audience:
            raise ValueError("the scope's audience is not a string")
        return cls(
            comment_on=_bound(claim.get("comment_on"), "comment_on"),
            post_in=_bound(claim.get("post_in"), "post_in"),
            reply_to=reply_to,
            audience=audience,
            # A claim from before egress rules: reads unbounded, as they were.
            reach=Reach.from_claim(claim["egress"]) if "egress" in claim else Reach.anywhere(),
        )


def _bound(value: object, name: str) -> frozenset[str] | None:
    if value == ANY:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return frozenset(value)
    raise ValueError(f"the scope's {name} is neither {ANY!r} nor a list of strings")


def _clip(value: object) -> str:
    text = value if isinstance(value, str) else ("" if value is None else repr(value))
    text = "".join(char if char.isprintable() else " " for char in text)
    return text if len(text) <= TARGET_CHARS else text[: TARGET_CHARS - 1] + "…"


class ArgumentRule(BaseModel):
    """An operator's rule for a third-party tool (``MCP_CONFIG`` ``scope``): ``argument``
    names the call's target, and only the values ``allow`` lists pass (``$posts``,
    ``$communities``: the task's own; ``*``: any; anything else: that exact value)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    argument: str = Field(min_length=1)
    allow: tuple[str, ...] = ()

    def refusal(
        self, tool: str, arguments: Mapping[str, Any], scope: TaskScope
    ) -> ScopeRefusal | None:
        allowed = scope.allowed_values(self.allow)
        value = arguments.get(self.argument)
        if allowed is None or (isinstance(value, str) and value in allowed):
            return None
        return ScopeRefusal(
            tool=tool,
            reason=ScopeReason.ARGUMENT_NOT_ALLOWED,
            message=(
                f"out of scope: the operator allows this task {tool} only with "
                f"{self.argument} among the values its scope permits"
            ),
            target=_clip(value),
        )
