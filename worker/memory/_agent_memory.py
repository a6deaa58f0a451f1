"""One agent's memory as its tasks use it: recall at context build, remember after the task.

``AgentMemory`` is bound to one agent when the task's definition is loaded, never to a
name the model gives, so a task reads and writes only its own agent's memories.

    recall:   candidates (newest SEARCH_WINDOW) → those of the task's audiences → rank by
              the definition's strategy → Recall
    remember: records → vectors (embedding_search) → store (size cap, oldest first)

Under embedding_search both steps call the embeddings endpoint: ``token_allowance`` is what
the task's ``max_tokens`` still leaves, a call that may need more is not made (recall
searches by keyword, the memories are stored without vectors), and what a call spent comes
back as ``embedding_tokens`` for the task's usage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from worker.agents import Memory, RecallStrategy
from worker.memory._embeddings import (
    Embedded,
    Embedder,
    EmbeddingsUnavailable,
    estimated_tokens,
    unit,
)
from worker.memory._recall import (
    Recalled,
    RecallQuery,
    rank_by_keywords,
    rank_by_similarity,
    rank_recent,
)
from worker.memory._records import MemoryRecord
from worker.memory._store import SEARCH_WINDOW, MemoryStore, Written

BYTES_PER_MB = 1024 * 1024
# What of a task's text is embedded to search with: its start says what it is about.
QUERY_CHARS = 4000


@dataclass(frozen=True, kw_only=True)
class Recall:
    """What one recall found, by which strategy (``keyword`` when embedding_search had no
    endpoint or its endpoint failed: ``fallback`` says why), and what it took."""

    items: list[Recalled]
    strategy: RecallStrategy
    duration_ms: float
    fallback: str = ""
    candidates: int = 0
    scores: list[float] = field(default_factory=list)
    # What the embeddings call spent (the task's usage counts it); 0 without one.
    embedding_tokens: int = 0


class AgentMemory:
    """The memory of ``agent`` under its definition's ``memory`` section."""

    def __init__(
        self, store: MemoryStore, agent: str, config: Memory, embedder: Embedder | None = None
    ) -> None:
        self._store = store
        self.agent = agent
        self.config = config
        self._embedder = embedder

    @property
    def strategy(self) -> RecallStrategy:
        """The strategy recall uses: embedding_search falls back to keyword without an endpoint."""
        wanted = self.config.retrieval.strategy
        if wanted is RecallStrategy.EMBEDDING_SEARCH and self._embedder is None:
            return RecallStrategy.KEYWORD
        return wanted

    @property
    def max_bytes(self) -> int:
        return self.config.max_size_mb * BYTES_PER_MB

    async def recall(
        self, query: RecallQuery, *, timeout_s: float, token_allowance: int | None = None
    ) -> Recall:
        started = time.perf_counter()
        retrieval = self.config.retrieval
        limit = retrieval.max_context_items
        strategy, fallback = self.strategy, ""
        items: list[Recalled] = []
        spent = _Spent()
        if strategy is RecallStrategy.RECENT:
            newest = self._newest_admitted(query, limit)
            candidates = len(items := rank_recent(newest, limit))
        else:
            ids = self._store.newest_ids(self.agent, SEARCH_WINDOW)
            candidates = len(ids)
            if strategy is RecallStrategy.EMBEDDING_SEARCH and ids:
                try:
                    items = await self._by_similarity(
                        ids, query, timeout_s=timeout_s, allowance=token_allowance, spent=spent
                    )
                except EmbeddingsUnavailable as exc:
                    strategy, fallback = RecallStrategy.KEYWORD, str(exc)
            if strategy is RecallStrategy.KEYWORD and ids:
                admitted = [r for r in self._store.records(self.agent, ids) if query.admits(r)]
                items = rank_by_keywords(admitted, query, limit)
        if retrieval.strategy is RecallStrategy.EMBEDDING_SEARCH and self._embedder is None:
            fallback = fallback or "MEMORY_EMBEDDINGS_URL is not set"
        return Recall(
            items=items,
            strategy=strategy,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
            fallback=fallback,
            candidates=candidates,
            scores=[item.score for item in items],
            embedding_tokens=spent.tokens,
        )

    async def remember(
        self,
        records: Sequence[MemoryRecord],
        *,
        timeout_s: float,
        token_allowance: int | None = None,
    ) -> Written:
        """Store ``records`` (with their embeddings under embedding_search), within the cap.
        An embeddings endpoint that fails, or a call the allowance cannot hold, leaves them
        without vectors, not unwritten."""
        if not records:
            return Written(written=0, evicted=0, bytes=self._store.usage(self.agent).bytes)
        vectors: dict[str, list[float]] = {}
        spent = _Spent()
        if self.strategy is RecallStrategy.EMBEDDING_SEARCH:
            try:
                embedded = await self._embed(
                    [record.text for record in records],
                    timeout_s=timeout_s,
                    allowance=token_allowance,
                    spent=spent,
                )
                pairs = zip(records, embedded.vectors, strict=True)
                vectors = {record.id: unit(vector) for record, vector in pairs}
            except EmbeddingsUnavailable:
                vectors = {}
        written = self._store.add(self.agent, records, max_bytes=self.max_bytes, vectors=vectors)
        return replace(written, embedding_tokens=spent.tokens)

    async def _embed(
        self, texts: list[str], *, timeout_s: float, allowance: int | None, spent: _Spent
    ) -> Embedded:
        """One embeddings call, made only when the task's tokens can hold it; ``spent``
        learns what it cost."""
        assert self._embedder is not None
        needed = estimated_tokens(texts)
        if allowance is not None and needed > allowance:
            raise EmbeddingsUnavailable(
                f"the task's max_tokens leaves {max(allowance, 0)} token(s), "
                f"the embeddings call may need {needed}"
            )
        embedded = await self._embedder.embed(texts, timeout_s=timeout_s)
        spent.tokens += embedded.tokens
        return embedded

    async def _by_similarity(
        self,
        ids: list[str],
        query: RecallQuery,
        *,
        timeout_s: float,
        allowance: int | None,
        spent: _Spent,
    ) -> list[Recalled]:
        """Score the window's vectors, then read only the memories chosen."""
        query_text = query.text[:QUERY_CHARS]
        embedded = await self._embed(
            [query_text], timeout_s=timeout_s, allowance=allowance, spent=spent
        )
        (query_vector,) = embedded.vectors
        retrieval = self.config.retrieval
        vectors = self._store.vectors(self.agent, ids)
        # Every memory above the threshold, best first: those of another audience drop out.
        similar = rank_by_similarity(
            vectors, query_vector, threshold=retrieval.relevance_threshold, limit=len(vectors)
        )
        records = {r.id: r for r in self._store.records(self.agent, [i for i, _ in similar])}
        found = [
            Recalled(record=records[memory_id], score=score)
            for memory_id, score in similar
            if memory_id in records and query.admits(records[memory_id])
        ]
        return found[: retrieval.max_context_items]

    def _newest_admitted(self, query: RecallQuery, limit: int) -> list[MemoryRecord]:
        """The newest ``limit`` memories the task may read: a second, wider read only when
        memories of another audience crowd the first."""
        newest = self._store.newest(self.agent, limit)
        admitted = [record for record in newest if query.admits(record)]
        if len(admitted) < limit and len(newest) == limit:
            wider = self._store.newest(self.agent, SEARCH_WINDOW)
            admitted = [record for record in wider if query.admits(record)]
        return admitted[:limit]


@dataclass
class _Spent:
    """The embedding tokens one recall or one write spent so far."""

    tokens: int = 0
