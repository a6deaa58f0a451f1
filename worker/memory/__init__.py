"""Agent memory (docs/how-to/memory.md): what an agent keeps across tasks, and reads back.

    _records        MemoryRecord, MemoryKind, Provenance: one memory, where it came from
                    and when, and whether a private task may recall it
    _extract        TaskExchange → records: the explicit step after a task, no model call
    _store          MemoryStore (the protocol) and RedisMemoryStore (size cap in Lua)
    _recall         rankings: recent, keyword, embedding similarity
    _embeddings     the operator's OpenAI-compatible embeddings endpoint
    _agent_memory   AgentMemory: one agent's memory as its tasks use it
    _render         recalled memories as one untrusted block of the prompt

The pipeline builds an ``AgentMemory`` for the task's own agent, recalls into the first
message, and remembers after the answer is delivered.
"""

from worker.memory._agent_memory import BYTES_PER_MB, AgentMemory, Recall
from worker.memory._embeddings import (
    Embedded,
    Embedder,
    EmbeddingsUnavailable,
    OpenAIEmbeddings,
    cosine,
    dot,
    embedder_from_settings,
    estimated_tokens,
    unit,
)
from worker.memory._extract import TaskExchange, decision_sentences, extract_memories
from worker.memory._recall import (
    Recalled,
    RecallQuery,
    rank_by_keywords,
    rank_by_similarity,
    rank_recent,
    words,
)
from worker.memory._records import MemoryKind, MemoryRecord, Provenance, memory_id
from worker.memory._render import MEMORY_INTRO, memory_block
from worker.memory._store import SEARCH_WINDOW, MemoryStore, MemoryUsage, RedisMemoryStore, Written

__all__ = [
    "BYTES_PER_MB",
    "MEMORY_INTRO",
    "SEARCH_WINDOW",
    "AgentMemory",
    "Embedded",
    "Embedder",
    "EmbeddingsUnavailable",
    "MemoryKind",
    "MemoryRecord",
    "MemoryStore",
    "MemoryUsage",
    "OpenAIEmbeddings",
    "Provenance",
    "Recall",
    "RecallQuery",
    "Recalled",
    "RedisMemoryStore",
    "TaskExchange",
    "Written",
    "cosine",
    "decision_sentences",
    "dot",
    "embedder_from_settings",
    "estimated_tokens",
    "extract_memories",
    "memory_block",
    "memory_id",
    "rank_by_keywords",
    "rank_by_similarity",
    "rank_recent",
    "unit",
    "words",
]
