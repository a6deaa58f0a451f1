"""One memory: what an agent kept from a task, where it came from and when."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

# A memory any task of the agent may recall (a DM's is ``dm:<person>``).
from worker.tools import PUBLIC


class Provenance(StrEnum):
    """What formed a memory's text, which decides whether a private task may recall it.

    Trusted means proven: the task that formed it read nothing but the words of its direct
    message's own person (no other author in the thread, not even the agent's earlier
    replies, which may echo what it read then; no tool result). Anything else is untrusted:
    a public thread, a page or tool result the task read, a note the model wrote with the
    ``remember`` tool (the server cannot know what the model read before), and a memory kept
    before provenance existed. A private task never recalls an untrusted memory: an
    instruction planted in one would reach the prompt that holds the private data."""

    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"


class MemoryKind(StrEnum):
    """What a memory holds; each is one switch of the definition's ``memory.remember``."""

    CONVERSATION = "conversation"  # remember.conversations_with
    DECISION = "decision"  # remember.decisions_made
    FEEDBACK = "feedback"  # remember.feedback_received
    PROJECT = "project"  # remember.projects_worked_on
    NOTE = "note"  # written by the agent itself, through the memory MCP server


@dataclass(frozen=True, kw_only=True)
class MemoryRecord:
    """One memory of one agent. ``text`` is stored redacted and names people by their Hub
    ids, never by display names (text anyone chooses); ``about`` holds those ids, so that
    one of them can be forgotten; ``audience`` is who the task that formed it spoke to
    (``public``, or ``dm:<person>`` for a direct message): recall gives it only to a task
    with the same audience; ``provenance`` whether a private task may recall it."""

    id: str
    kind: MemoryKind
    text: str
    task_id: str
    created_at: float
    about: tuple[str, ...] = ()
    thread: str | None = None
    audience: str = PUBLIC
    provenance: Provenance = Provenance.UNTRUSTED

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "kind": self.kind.value,
                "text": self.text,
                "task_id": self.task_id,
                "created_at": float(self.created_at),
                "about": list(self.about),
                "thread": self.thread,
                "audience": self.audience,
                "provenance": self.provenance.value,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> MemoryRecord | None:
        """The record, or None for a value that is not one (never raises on stored data)."""
        try:
            data: Any = json.loads(raw)
            return cls(
                id=str(data["id"]),
                kind=MemoryKind(data["kind"]),
                text=str(data["text"]),
                task_id=str(data["task_id"]),
                created_at=float(data["created_at"]),
                about=tuple(str(name) for name in data.get("about") or ()),
                thread=str(data["thread"]) if data.get("thread") else None,
                # Kept before audiences existed: public, as every task then treated it.
                audience=str(data.get("audience") or PUBLIC),
                # Kept before provenance existed, or unreadable: nothing proves it trusted.
                provenance=_provenance(data.get("provenance")),
            )
        except (ValueError, KeyError, TypeError):
            return None

    @property
    def recallable(self) -> bool:
        """Whether any task could ever recall it: a public task reads public memories, a
        private one trusted memories of its own audience; an untrusted memory of a direct
        message is neither, and is not worth keeping (the private words it holds least)."""
        return self.audience == PUBLIC or self.provenance is Provenance.TRUSTED

    def source(self) -> str:
        """Where it came from and when, as one line: ``conversation with ron, thread p-42,
        task t-1, 2026-11-25 19:04 UTC``."""
        what = {
            MemoryKind.CONVERSATION: f"conversation with {', '.join(self.about) or 'someone'}",
            MemoryKind.DECISION: "a decision you stated",
            MemoryKind.FEEDBACK: f"feedback from {', '.join(self.about) or 'someone'}",
            MemoryKind.PROJECT: "work you did",
            MemoryKind.NOTE: "a note you kept",
        }[self.kind]
        where = f", thread {self.thread}" if self.thread else ""
        when = datetime.fromtimestamp(self.created_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"{what}{where}, task {self.task_id}, {when}"

    def mentions(self, name: str) -> bool:
        """Whether the memory concerns ``name``: it is about them, or its text names them."""
        # Case-blind on purpose: forgetting errs towards erasing more (and memories kept
        # before exact ids hold lower-cased ones).
        wanted = name.strip().lower()
        if not wanted:
            return False
        # As a whole name: forgetting "ron" must not touch a memory that says "wrong".
        named = re.compile(rf"(?<![\w-]){re.escape(wanted)}(?![\w-])")
        about = {person.lower() for person in self.about}
        return wanted in about or named.search(self.text.lower()) is not None


def _provenance(value: object) -> Provenance:
    return Provenance.TRUSTED if value == Provenance.TRUSTED.value else Provenance.UNTRUSTED


def memory_id(*parts: str) -> str:
    """A stable id from what makes a memory the same one (a re-run of a task, the same
    comment read again): writing it again replaces it instead of adding a copy."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()
    return f"m-{digest}"
