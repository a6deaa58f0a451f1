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

from worker.memory._agent_memory import AgentMemory as AgentMemory
from worker.memory._embeddings import embedder_from_settings as embedder_from_settings
from worker.memory._extract import TaskExchange as TaskExchange
from worker.memory._extract import extract_memories as extract_memories
from worker.memory._recall import RecallQuery as RecallQuery
from worker.memory._records import MemoryKind as MemoryKind
from worker.memory._records import MemoryRecord as MemoryRecord
from worker.memory._records import Provenance as Provenance
from worker.memory._records import memory_id as memory_id
from worker.memory._render import memory_block as memory_block
from worker.memory._store import MemoryStore as MemoryStore
from worker.memory._store import RedisMemoryStore as RedisMemoryStore
