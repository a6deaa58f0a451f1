"""Shaping what the model reads and what the report keeps: truncation, compaction, recovery."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Sequence

from worker.loop._state import StepRecord
from worker.models import Message

_POINTER = re.compile(
    r"^\W*(?:see|as (?:stated|shown|written|mentioned)|refer to)\b.{0,40}"
    r"\b(?:above|previous|earlier|before)\b\W*$|^\W*(?:done|finished|complete[d]?)\W*$",
    re.IGNORECASE,
)


# Sentences that announce work still to do: the text of a step that goes on to call tools.
_ANNOUNCING = re.compile(
    r"(?:^|[.!?]\s+)(?:ok(?:ay)?[,.]?\s+|sure[,.]?\s+|first[,.]?\s+|now[,.]?\s+)?"
    r"(?:let me|let's|i'll|i will|i'm going to|i am going to|i need to|i should|going to|"
    r"checking|looking|searching|fetching|reading)\b",
    re.IGNORECASE,
)
# The stricter form for a text that came without a tool call: first-person work to come,
# never a refusal ("I will not share that." answers) nor a gerund that opens an answer
# ("Looking at the logs, the disk is full.").
_PROMISING = re.compile(
    r"^(?:ok(?:ay)?[,.]?\s+|sure[,.]?\s+|first[,.]?\s+|now[,.]?\s+)?"
    r"(?:let me|let's|i'll|i will|i'm going to|i am going to|i need to|i should|going to)\b"
    r"(?!\s+(?:not|never)\b)",
    re.IGNORECASE,
)
_SHORT_TEXT = 200
# The opening of a retold tool call, as the retold closing turn words them, with or without
# brackets: small models copy the retelling into their answer (Qwen2.5-Coder 0.5B did, most
# of the time). Its arguments follow as JSON.
_RETOLD_CALL = re.compile(r"\W*(?:i|you) (?:have )?called\s+[\w.-]+(?:\s+with\b\s*)?", re.I)
_JSON = json.JSONDecoder()


def truncate(text: str, max_chars: int) -> str:
    """Cut ``text`` to ``max_chars`` with a marker saying how much was left out."""
    if len(text) <= max_chars:
        return text
    omitted = len(text) - max_chars
    return f"{text[:max_chars]}\n[truncated: {omitted} of {len(text)} characters omitted]"


def is_pointer(text: str) -> bool:
    """A closing turn that only points back ("see above") instead of carrying the answer."""
    stripped = text.strip()
    return bool(stripped) and len(stripped) <= 80 and _POINTER.match(stripped) is not None


def is_preamble(step: StepRecord) -> bool:
    """Text that announces the step's tool calls ("Let me look that up first.")."""
    if not step.requested_calls:
        return False
    text = step.text.strip()
    if text.endswith((":", "...", "…")) or _ANNOUNCING.match(text) is not None:
        return True
    # A short text announcing anything is a preamble; a long one that opens with an
    # answer is a front-loaded answer, even if it ends by announcing the tool call.
    return len(text) < _SHORT_TEXT and _ANNOUNCING.search(text) is not None


def is_announcement(text: str) -> bool:
    """A short text that only announces work ("I'll fetch the page now."), not an answer."""
    stripped = text.strip()
    if not stripped or len(stripped) >= _SHORT_TEXT:
        return False
    return stripped.endswith((":", "...", "…")) or _PROMISING.match(stripped) is not None


def is_retold_call(text: str) -> bool:
    """Text that only says which tools were called ("(I called get_feed with {})")."""
    rest = text.strip()
    while rest:
        opening = _RETOLD_CALL.match(rest)
        if opening is None:
            return False
        rest = rest[opening.end() :]
        if rest[:1] in ("{", "["):
            try:
                _, end = _JSON.raw_decode(rest)
            except ValueError:
                return False
            rest = rest[end:]
        rest = rest.lstrip(").;, \n\t")
    return bool(text.strip())


def is_answer(text: str, *, worker_words: str = "") -> bool:
    """Text that can stand as the task's answer: not blank, not only an announcement,
    not only a retelling of the calls made, and not repeating ``worker_words``, what the
    worker told the model in the closing turn (Qwen2.5-Coder 0.5B answers "the worker
    stopped your tool calls: …": words for the model, never for the Hub)."""
    return (
        bool(text.strip())
        and not is_announcement(text)
        and not is_retold_call(text)
        and not _repeats(text, worker_words)
    )


def _repeats(text: str, words: str) -> bool:
    said = " ".join(words.lower().split()).rstrip(".")
    return bool(said) and said in " ".join(text.lower().split())


def recover_output(steps: Sequence[StepRecord], closing_text: str) -> str:
    """The report's output: the closing text, or the answer it points back to.

    Only a closing turn that is a pointer ("See my answer above.") is replaced, by
    the last earlier text that is an answer: never a pointer, never the preamble of
    a tool call. No closing text (a limit left no room for one, the run was
    cancelled) recovers nothing: an announcement is not an answer worth posting.
    """
    if not is_pointer(closing_text):
        return closing_text
    for step in reversed(steps):
        text = step.text.strip()
        if text and not is_pointer(text) and not is_preamble(step):
            return step.text
    return ""


class Compactor:
    """Keeps old tool outputs within a character budget by replacing the oldest with a stub.

    Tracks sizes as results arrive, so the cost per step stays flat however
    long the conversation grows.
    """

    def __init__(self, budget_chars: int) -> None:
        self._budget = budget_chars
        self._live: deque[tuple[int, int]] = deque()  # (message index, length)
        self._total = 0

    def add(self, index: int, length: int) -> None:
        self._live.append((index, length))
        self._total += length

    def compact(self, messages: list[Message], changed: Callable[[int], None] | None = None) -> int:
        """Stub the oldest outputs (never the newest) until under budget; return how many.

        ``changed`` is told the index of each message stubbed.
        """
        stubbed = 0
        while self._total > self._budget and len(self._live) > 1:
            index, length = self._live.popleft()
            self._total -= length
            message = messages[index]
            message.content = f"[tool output of {length} characters removed to save context]"
            if changed is not None:
                changed(index)
            stubbed += 1
        return stubbed


def plain_history(messages: Sequence[Message]) -> list[Message]:
    """The conversation retold without tool calls: each call and its result as plain text.

    For a closing retry: a small model that sees its own calls in the history answers a
    tool-less turn with one more imitation of a call (Qwen2.5-Coder 1.5B does). Told in
    words what it called and what came back, it answers. The calls are told on the user's
    side ("You called …"), so the model's own turns hold only what it wrote: a retelling
    in its own turns is what a smaller model copies as its answer (Qwen2.5-Coder 0.5B did).
    Results keep their untrusted-content tags. Empty assistant turns are left out, and
    turns of one role in a row are joined, as some chat templates require alternating roles.
    """
    told: list[Message] = []
    calls: dict[str, str] = {}
    for message in messages:
        if message.role == "tool":
            said = calls.get(message.tool_call_id or "", "You called a tool.")
            told.append(Message(role="user", content=f"{said} Result:\n{message.content}"))
            continue
        for call in message.tool_calls:
            calls[call.id] = f"You called {call.name} with {call.arguments}."
        if message.content.strip():
            told.append(Message(role=message.role, content=message.content.strip()))
    joined: list[Message] = []
    for message in told:
        if joined and joined[-1].role == message.role:
            joined[-1] = Message(
                role=message.role, content=f"{joined[-1].content}\n\n{message.content}"
            )
        else:
            joined.append(message)
    return joined
