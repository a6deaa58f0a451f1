"""Which memories a task reads: ranking by recency, shared words, or embedding similarity.

Each ranking takes the candidates (the newest ``SEARCH_WINDOW`` memories) and what the
task is about, and returns at most ``limit`` of them, best first. They are pure, so the
tests pin each one down without Redis or an endpoint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.memory._embeddings import dot, unit
from worker.memory._records import MemoryRecord, Provenance
from worker.tools import PUBLIC

# Words too common to say two texts are about the same thing.
_STOPWORDS = frozenset(
    """about after again also and any are because been before being but can could did does
    doing down each few for from further had has have having her here hers him his how into
    its just more most not now off once only other our out over own same she should some
    such than that the their them then there these they this those through too under until
    very was were what when where which while who whom why will with would you your yours
    said answered hey hello thanks please""".split()  # noqa: SIM905 (a list literal of 90 words)
)
_WORD = re.compile(r"[a-z0-9][a-z0-9_-]{2,}")


@dataclass(frozen=True, kw_only=True)
class RecallQuery:
    """What the task is about: its text (the thread, or the agent's interests) and the
    people in it (their exact Hub ids); and what it may read: memories of its
    ``audiences`` (public ones, and those of its own direct message), and when the task is
    ``private`` (its prompt holds what is not public) only trusted ones of those."""

    text: str
    people: frozenset[str] = frozenset()
    audiences: frozenset[str] = frozenset({PUBLIC})
    private: bool = False

    def admits(self, record: MemoryRecord) -> bool:
        if self.private and record.provenance is not Provenance.TRUSTED:
            return False
        return record.audience in self.audiences


@dataclass(frozen=True, kw_only=True)
class Recalled:
    """A memory chosen for a task, with the score it was chosen by (recency: 0)."""

    record: MemoryRecord
    score: float = 0.0


def rank_recent(candidates: Sequence[MemoryRecord], limit: int) -> list[Recalled]:
    newest = sorted(candidates, key=lambda record: record.created_at, reverse=True)
    return [Recalled(record=record) for record in newest[:limit]]


def rank_by_keywords(
    candidates: Sequence[MemoryRecord], query: RecallQuery, limit: int
) -> list[Recalled]:
    """Memories sharing words with the task, or about someone in it; the score is the
    share of the task's words the memory holds, plus one when it is about a participant.

    A task word counts where the memory's text contains it ("cache" in "caches"): a
    substring test per word, several times faster than splitting every memory into words.
    """
    wanted = words(query.text)
    scored = []
    for record in candidates:
        text = record.text.lower()
        shared = sum(word in text for word in wanted) / len(wanted) if wanted else 0.0
        about_participant = 1.0 if query.people & set(record.about) else 0.0
        score = shared + about_participant
        if score > 0:
            scored.append(Recalled(record=record, score=round(score, 4)))
    scored.sort(key=lambda item: (item.score, item.record.created_at), reverse=True)
    return scored[:limit]


def rank_by_similarity(
    vectors: Mapping[str, Sequence[float]],
    query_vector: Sequence[float],
    *,
    threshold: float,
    limit: int,
) -> list[tuple[str, float]]:
    """The ids of the memories whose embedding is at least ``threshold`` similar (cosine)
    to the task's, with that similarity, best first; ``vectors`` are unit vectors (as
    ``AgentMemory`` stores them), newest first, and of two equal scores the newer wins.
    Only the chosen memories are read afterwards."""
    query = unit(query_vector)
    scored = []
    for order, (memory_id, vector) in enumerate(vectors.items()):
        similarity = dot(vector, query)
        if similarity >= threshold:
            scored.append((round(similarity, 4), -order, memory_id))
    scored.sort(reverse=True)
    return [(memory_id, similarity) for similarity, _, memory_id in scored[:limit]]


def words(text: str) -> set[str]:
    """The distinctive words of ``text``: lower-cased, three characters or more, no stopword."""
    return {word for word in _WORD.findall(text.lower()) if word not in _STOPWORDS}
