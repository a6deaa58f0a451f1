"""Where memories live: the ``MemoryStore`` protocol and its Redis implementation.

The Redis store keeps, per agent (keys in ``worker.redis_io.keys``)::

    agent-worker:memory:<agent>:records   hash   id -> JSON record
    agent-worker:memory:<agent>:order     zset   id scored by when it was written
    agent-worker:memory:<agent>:vectors   hash   id -> float32 embedding (embedding_search)
    agent-worker:memory:bytes             hash   agent -> bytes of records and vectors

Writing and the size cap are one Lua script, so two tasks of one agent on two hosts
can never leave it above ``max_size_mb``: the oldest memories give way first. A store
of another kind (a vector database) replaces it by implementing ``MemoryStore``.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from redis import Redis

from worker.memory._records import MemoryRecord
from worker.redis_io import keys as redis_keys

# How many of the newest memories a search reads: keyword and embedding ranking look at
# these, so a task's recall costs the same however large the memory grew.
SEARCH_WINDOW = 1000

_ADD = """
local records, order, vectors, sizes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local agent, max_bytes = ARGV[1], tonumber(ARGV[2])
for i = 3, #ARGV, 4 do
  local id, score, record, vector = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local old = redis.call('HSTRLEN', records, id) + redis.call('HSTRLEN', vectors, id)
  redis.call('HSET', records, id, record)
  if vector ~= '' then
    redis.call('HSET', vectors, id, vector)
  else
    redis.call('HDEL', vectors, id)
  end
  redis.call('ZADD', order, score, id)
  redis.call('HINCRBY', sizes, agent, #record + #vector - old)
end
local evicted = 0
local size = tonumber(redis.call('HGET', sizes, agent) or '0')
while size > max_bytes do
  local oldest = redis.call('ZRANGE', order, 0, 0)
  if #oldest == 0 then break end
  local id = oldest[1]
  local freed = redis.call('HSTRLEN', records, id) + redis.call('HSTRLEN', vectors, id)
  redis.call('HDEL', records, id)
  redis.call('HDEL', vectors, id)
  redis.call('ZREM', order, id)
  size = redis.call('HINCRBY', sizes, agent, -freed)
  evicted = evicted + 1
end
if redis.call('ZCARD', order) == 0 then
  redis.call('DEL', records, order, vectors)
  redis.call('HDEL', sizes, agent)
end
return {evicted, size}
"""

_FORGET = """
local records, order, vectors, sizes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local agent = ARGV[1]
local forgotten = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', order, id) == 1 or redis.call('HEXISTS', records, id) == 1 then
    forgotten = forgotten + 1
  end
  local freed = redis.call('HSTRLEN', records, id) + redis.call('HSTRLEN', vectors, id)
  redis.call('HDEL', records, id)
  redis.call('HDEL', vectors, id)
  if freed > 0 then redis.call('HINCRBY', sizes, agent, -freed) end
end
if redis.call('ZCARD', order) == 0 then
  redis.call('DEL', records, order, vectors)
  redis.call('HDEL', sizes, agent)
end
return forgotten
"""


@dataclass(frozen=True, kw_only=True)
class MemoryUsage:
    """How much one agent's memory holds."""

    items: int
    bytes: int


@dataclass(frozen=True, kw_only=True)
class Written:
    """What one write did: memories written, older ones evicted, bytes held after it, and
    the tokens their embeddings spent (``AgentMemory`` fills it; a store embeds nothing)."""

    written: int
    evicted: int
    bytes: int
    embedding_tokens: int = 0


class MemoryStore(Protocol):
    """Memories by agent. Every method takes the agent: a task only ever passes its own
    (``AgentMemory`` is bound to it), so one agent never reads another's."""

    def add(
        self,
        agent: str,
        records: Sequence[MemoryRecord],
        *,
        max_bytes: int,
        vectors: Mapping[str, Sequence[float]] | None = None,
    ) -> Written:
        """Write ``records`` (replacing any with the same id), then evict the oldest until
        the agent's memory holds at most ``max_bytes``."""
        ...

    def newest(self, agent: str, limit: int) -> list[MemoryRecord]:
        """The newest ``limit`` memories, newest first."""
        ...

    def newest_ids(self, agent: str, limit: int) -> list[str]:
        """The ids of the newest ``limit`` memories, newest first."""
        ...

    def records(self, agent: str, ids: Sequence[str]) -> list[MemoryRecord]:
        """These memories, in this order (ids the agent does not have are left out)."""
        ...

    def vectors(self, agent: str, ids: Sequence[str]) -> dict[str, Sequence[float]]:
        """The embeddings kept for these memories (those without one are left out)."""
        ...

    def get(self, agent: str, memory_id: str) -> MemoryRecord | None: ...

    def forget(self, agent: str, ids: Sequence[str] | None = None) -> int:
        """Forget these memories (None: all of the agent's); returns how many there were."""
        ...

    def usage(self, agent: str) -> MemoryUsage: ...


class RedisMemoryStore:
    """``MemoryStore`` on the fleet's Redis (the connection rq gives the worker)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._add = redis.register_script(_ADD)
        self._forget = redis.register_script(_FORGET)

    def add(
        self,
        agent: str,
        records: Sequence[MemoryRecord],
        *,
        max_bytes: int,
        vectors: Mapping[str, Sequence[float]] | None = None,
    ) -> Written:
        arguments: list[str | bytes | float] = [agent, max_bytes]
        for record in records:
            vector = (vectors or {}).get(record.id)
            packed = array("f", vector).tobytes() if vector else b""
            arguments += [record.id, record.created_at, record.to_json(), packed]
        evicted, size = self._add(keys=_keys(agent), args=arguments)
        return Written(written=len(records), evicted=int(evicted), bytes=int(size))

    def newest(self, agent: str, limit: int) -> list[MemoryRecord]:
        return self.records(agent, self.newest_ids(agent, limit))

    def newest_ids(self, agent: str, limit: int) -> list[str]:
        if limit <= 0:
            return []
        ids: list[bytes] = self._redis.zrevrange(redis_keys.memory_order(agent), 0, limit - 1)  # type: ignore[assignment]
        return [memory_id.decode() for memory_id in ids]

    def all(self, agent: str) -> list[MemoryRecord]:
        """Every memory of the agent, oldest first (for operators: ``agent-worker memory``)."""
        ids: list[bytes] = self._redis.zrange(redis_keys.memory_order(agent), 0, -1)  # type: ignore[assignment]
        return self.records(agent, [memory_id.decode() for memory_id in ids])

    def records(self, agent: str, ids: Sequence[str]) -> list[MemoryRecord]:
        if not ids:
            return []
        raws: list[bytes | None] = self._redis.hmget(redis_keys.memory_records(agent), list(ids))  # type: ignore[assignment]
        records = (MemoryRecord.from_json(raw) for raw in raws if raw)
        return [record for record in records if record is not None]

    def vectors(self, agent: str, ids: Sequence[str]) -> dict[str, Sequence[float]]:
        if not ids:
            return {}
        packed: list[bytes | None] = self._redis.hmget(redis_keys.memory_vectors(agent), list(ids))  # type: ignore[assignment]
        # Left as float32 arrays: ranking reads them as they are, with no list of floats built.
        return {
            memory_id: array("f", raw) for memory_id, raw in zip(ids, packed, strict=True) if raw
        }

    def get(self, agent: str, memory_id: str) -> MemoryRecord | None:
        raw: bytes | None = self._redis.hget(redis_keys.memory_records(agent), memory_id)  # type: ignore[assignment]
        return MemoryRecord.from_json(raw) if raw else None

    def forget(self, agent: str, ids: Sequence[str] | None = None) -> int:
        if ids is None:
            count = int(self._redis.zcard(redis_keys.memory_order(agent)))  # type: ignore[arg-type]
            with self._redis.pipeline() as pipe:
                pipe.delete(*_keys(agent)[:3])
                pipe.hdel(redis_keys.MEMORY_BYTES, agent)
                pipe.execute()
            return count
        if not ids:
            return 0
        return int(self._forget(keys=_keys(agent), args=[agent, *ids]))

    def usage(self, agent: str) -> MemoryUsage:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(redis_keys.memory_order(agent))
            pipe.hget(redis_keys.MEMORY_BYTES, agent)
            items, size = pipe.execute()
        return MemoryUsage(items=int(items), bytes=int(size or 0))

    def agents(self) -> list[str]:
        """Agents that have a memory, by name."""
        names: list[bytes] = self._redis.hkeys(redis_keys.MEMORY_BYTES)  # type: ignore[assignment]
        return sorted(name.decode() for name in names)


def _keys(agent: str) -> list[str]:
    return [
        redis_keys.memory_records(agent),
        redis_keys.memory_order(agent),
        redis_keys.memory_vectors(agent),
        redis_keys.MEMORY_BYTES,
    ]
