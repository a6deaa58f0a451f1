"""What a finished task leaves in memory: an explicit step, with no model call of its own.

    thread + delivered answer → conversations, feedback, decisions, projects
                               (each only if the definition's ``memory.remember`` asks)

Everything is read from what the task already has: the thread it answered (who said
what) and the answer it delivered. Decisions are the answer's own sentences that state
one ("I will ...", "We decided ...", "Decision: ..."). No second model call is made,
so remembering costs no tokens and no money.

People are named by their Hub ids only: a display name is text its account chose (an
account named "eve" is not eve). Each record carries the task's audience and provenance
(``TaskExchange.provenance``: trusted only when the task read nothing but its direct
message's own person).

The texts come from the Hub and are recalled inside the untrusted-content delimiters.
They arrive redacted, each whole (the thread as the task read it, the answer as it was
delivered): the clips here would halve a secret a redactor run afterwards could no longer
recognise. This module only selects and clips.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from hub_client import Comment, Post
from worker.agents import MemoryRemember
from worker.memory._records import MemoryKind, MemoryRecord, Provenance, memory_id
from worker.tools import PUBLIC, dm_audience

# Of one thread, what a conversation memory keeps: the person's last words, clipped.
MESSAGES_PER_PERSON = 2
MESSAGE_CHARS = 600
ANSWER_CHARS = 800
FEEDBACK_PER_TASK = 3
DECISIONS_PER_TASK = 3
DECISION_CHARS = 300
PROJECT_CHARS = 300

# A sentence in which the agent states what it (or its team) decided or will do.
_DECISION = re.compile(
    r"^\s*(?:decision|decided|resolution)\s*:"
    r"|\b(?:i|we)\s*(?:['\u2019]ll|\s+(?:will|shall|won't|will not|decided|have decided|"
    r"am going to|are going to|chose|choose|plan to|intend to))\b"
    r"|\blet(?:['\u2019]s| us)\s+(?:go with|use|keep|switch|adopt|stick)\b",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True, kw_only=True)
class TaskExchange:
    """What a finished task offers memory: its thread (a notification's, redacted; None for
    an exploration), the answer it delivered (redacted; empty when none) and, for an
    exploration, the summary of what it explored. Redacted before anything is clipped.
    ``audience`` is the task's (its scope's); ``read_tool_results`` whether a tool result
    reached the model (unknown counts as yes)."""

    agent: str
    task_id: str
    at: float
    thread: Post | None = None
    answer: str = ""
    summary: str = ""
    audience: str = PUBLIC
    read_tool_results: bool = True

    def provenance(self) -> Provenance:
        """Trusted when all the task read was its direct message's own person: every author
        of the thread is that person (exact id), and no tool result reached the model. Its
        recalled memories were trusted too, as a private task recalls no other."""
        if self.thread is None or self.read_tool_results:
            return Provenance.UNTRUSTED
        thread = self.thread
        authors = [thread.author, *(comment.author for comment in thread.comments)]
        if all(dm_audience(author.id) == self.audience for author in authors):
            return Provenance.TRUSTED
        return Provenance.UNTRUSTED


def extract_memories(exchange: TaskExchange, remember: MemoryRemember) -> list[MemoryRecord]:
    """The memories ``remember`` asks for, from one task. Pure: the same exchange gives the
    same records (ids included), so a re-run of a task replaces them."""
    records: list[MemoryRecord] = []
    if exchange.thread is not None and exchange.answer:
        records += _conversations(exchange, remember.conversations_with)
    if exchange.thread is not None and remember.feedback_received:
        records += _feedback(exchange, exchange.thread)
    if remember.decisions_made and exchange.answer:
        records += _decisions(exchange)
    if remember.projects_worked_on:
        records += _project(exchange)
    provenance = exchange.provenance()
    return [
        replace(record, audience=exchange.audience, provenance=provenance) for record in records
    ]


def decision_sentences(text: str) -> list[str]:
    """The sentences of ``text`` that state a decision, in order, each clipped."""
    sentences = (sentence.strip() for sentence in _SENTENCE_END.split(text))
    return [_clip(s, DECISION_CHARS) for s in sentences if s and _DECISION.search(s)]


def _conversations(exchange: TaskExchange, names: list[str]) -> Iterator[MemoryRecord]:
    assert exchange.thread is not None
    # Hub ids, exactly as the definition lists them: a display name never matches.
    wanted = {name.strip() for name in names if name.strip()}
    spoken = _messages(exchange.thread)
    for person in sorted(wanted - {exchange.agent}):
        theirs = [text for who, text in spoken if who == person][-MESSAGES_PER_PERSON:]
        if not theirs:
            continue
        lines = [f"{person} said: {_clip(text, MESSAGE_CHARS)}" for text in theirs]
        lines.append(f"You answered: {_clip(exchange.answer, ANSWER_CHARS)}")
        yield MemoryRecord(
            id=memory_id(exchange.agent, "conversation", exchange.task_id, person),
            kind=MemoryKind.CONVERSATION,
            text="\n".join(lines),
            task_id=exchange.task_id,
            created_at=exchange.at,
            about=(person,),
            thread=exchange.thread.id,
        )


def _feedback(exchange: TaskExchange, thread: Post) -> Iterator[MemoryRecord]:
    """Replies to the agent: every comment by someone else on its own post, or after its
    own comment in the thread."""
    agent = exchange.agent
    answered = thread.author.id == agent
    replies: list[Comment] = []
    for comment in thread.comments:
        if comment.author.id == agent:
            answered = True
        elif answered:
            replies.append(comment)
    for comment in replies[-FEEDBACK_PER_TASK:]:
        author = comment.author.id
        yield MemoryRecord(
            # The same reply read again by a later task is the same memory.
            id=memory_id(exchange.agent, "feedback", thread.id, comment.id),
            kind=MemoryKind.FEEDBACK,
            text=f"{author} replied to you: {_clip(comment.content, MESSAGE_CHARS)}",
            task_id=exchange.task_id,
            created_at=exchange.at,
            about=(author,),
            thread=thread.id,
        )


def _decisions(exchange: TaskExchange) -> Iterator[MemoryRecord]:
    sentences = decision_sentences(exchange.answer)[:DECISIONS_PER_TASK]
    if sentences:
        yield MemoryRecord(
            id=memory_id(exchange.agent, "decision", exchange.task_id),
            kind=MemoryKind.DECISION,
            text="\n".join(f"You decided: {sentence}" for sentence in sentences),
            task_id=exchange.task_id,
            created_at=exchange.at,
            thread=exchange.thread.id if exchange.thread else None,
        )


def _project(exchange: TaskExchange) -> Iterator[MemoryRecord]:
    thread = exchange.thread
    if thread is not None:
        first_line = next(iter(thread.content.strip().splitlines()), "")
        subject = _clip(thread.title or first_line, PROJECT_CHARS) or f"post {thread.id}"
        yield MemoryRecord(
            # One memory per thread, brought up to date by each task on it.
            id=memory_id(exchange.agent, "project", thread.id),
            kind=MemoryKind.PROJECT,
            text=f"You worked on “{subject}” in {thread.community or 'm/general'}.",
            task_id=exchange.task_id,
            created_at=exchange.at,
            # The subject is the post author's words: forgetting them forgets it too.
            about=(thread.author.id,),
            thread=thread.id,
        )
    elif exchange.summary.strip():
        yield MemoryRecord(
            id=memory_id(exchange.agent, "project", exchange.task_id),
            kind=MemoryKind.PROJECT,
            text=f"You explored: {_clip(exchange.summary.strip(), PROJECT_CHARS)}",
            task_id=exchange.task_id,
            created_at=exchange.at,
        )


def _messages(thread: Post) -> list[tuple[str, str]]:
    """Who said what in the thread, in order: (the author's Hub id, the text)."""
    spoken = [(thread.author.id, thread.content)]
    spoken += [(comment.author.id, comment.content) for comment in thread.comments]
    return [(who, text) for who, text in spoken if text.strip()]


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
