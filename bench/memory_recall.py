"""What agent memory costs a task: recall at context build (ms, prompt tokens added) and
the write after it, by strategy and by how many memories the agent holds.

A private redis-server holds the memory; ``embedding_search`` asks the scripted
endpoint's ``/v1/embeddings`` (deterministic vectors, served over loopback HTTP from
this process), so its column is the cost of our side plus one local HTTP round trip,
not a real embedding model's. Tokens are the worker's own estimate (3.5 characters per
token) of the memory block placed in the first message, ``max_context_items`` 10.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack
from functools import partial

import anyio
import redis

from bench._report import Summary, Table
from bench._size import Size
from worker._tokens import CHARS_PER_TOKEN
from worker.agents import Memory, MemoryRemember
from worker.agents._config import MemoryRetrieval
from worker.dev.devstack import start_redis
from worker.dev.scripted_endpoint import ScriptedEndpoint
from worker.dev.scripted_endpoint._embeddings import embedding
from worker.memory import (
    AgentMemory,
    MemoryKind,
    MemoryRecord,
    RecallQuery,
    RedisMemoryStore,
    memory_block,
    memory_id,
)
from worker.memory._embeddings import OpenAIEmbeddings, unit
from worker.models import UntrustedBlocks

AGENT = "bench-agent"
PEOPLE = ["ron", "alice", "bob", "mia", "sam", "lee"]
_WORDS = (  # noqa: SIM905 (50 words read better as one string)
    "redis queue worker deploy rollback cache latency retry timeout lease metric alert "
    "grafana prometheus budget token cost thread comment post review release schema index "
    "migration backup replica failover sentinel cluster memory eviction policy noeviction "
    "friday monday staging production canary rollout hotfix incident postmortem"
).split()
QUERY = "Hey, the redis queue lost its lease during the friday deploy: rollback or retry?"


def conversation(rng: random.Random, n: int) -> MemoryRecord:
    """A memory like the worker writes: what someone said, and the answer (about 500 chars)."""
    person = rng.choice(PEOPLE)
    said = " ".join(rng.choice(_WORDS) for _ in range(30))
    answered = " ".join(rng.choice(_WORDS) for _ in range(40))
    return MemoryRecord(
        id=memory_id(AGENT, "bench", str(n)),
        kind=MemoryKind.CONVERSATION,
        text=f"{person} said: {said}\nYou answered: {answered}",
        task_id=f"t-{n}",
        created_at=1_700_000_000 + n,
        about=(person,),
        thread=f"p-{n}",
    )


def fill(store: RedisMemoryStore, count: int) -> None:
    store.forget(AGENT)
    rng = random.Random(count)
    records = [conversation(rng, n) for n in range(count)]
    for start in range(0, count, 500):
        batch = records[start : start + 500]
        vectors = {record.id: unit(embedding(record.text)) for record in batch}
        store.add(AGENT, batch, max_bytes=1000 * 1024 * 1024, vectors=vectors)


def config(strategy: str) -> Memory:
    return Memory(
        enabled=True,
        remember=MemoryRemember(conversations_with=PEOPLE, decisions_made=True),
        retrieval=MemoryRetrieval(
            strategy=strategy,  # type: ignore[arg-type]
            max_context_items=10,
            # The scripted vectors are bag-of-words: random texts sit near 0.1-0.3.
            relevance_threshold=0.1,
        ),
    )


def recall_ms(memory: AgentMemory, runs: int) -> tuple[Summary, int, int]:
    query = RecallQuery(text=QUERY, people=frozenset({"ron"}))
    samples, chars, items = [], 0, 0
    for _ in range(runs + 1):
        started = time.perf_counter()
        found = anyio.run(partial(memory.recall, query, timeout_s=10))
        block = memory_block(found.items, UntrustedBlocks())
        samples.append((time.perf_counter() - started) * 1000)
        chars, items = len(block), len(found.items)
    return Summary.of(samples[1:]), chars, items  # the first run warms the connection


def write_ms(memory: AgentMemory, runs: int) -> Summary:
    rng = random.Random(99)
    samples = []
    for n in range(runs):
        records = [conversation(rng, 10_000_000 + n * 3 + k) for k in range(3)]
        started = time.perf_counter()
        anyio.run(partial(memory.remember, records, timeout_s=10))
        samples.append((time.perf_counter() - started) * 1000)
    return Summary.of(samples)


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    held = size.pick(full=[0, 100, 1000, 10_000], quick=[0, 100, 1000], smoke=[0, 100])
    runs = size.pick(full=30, quick=5, smoke=1)
    recall = Table(
        "memory recall per task, by strategy and memories held (ms; tokens added to the prompt)",
        ["memories", "strategy", "recall median", "min-max", "items", "tokens added"],
    )
    write = Table(
        "memory write after a task (3 memories, cap enforced in the same Lua call) (ms)",
        ["memories", "strategy", "write median", "min-max"],
    )
    with ExitStack() as stack, ScriptedEndpoint() as endpoint:
        connection = redis.Redis.from_url(start_redis(stack))
        stack.callback(connection.close)
        store = RedisMemoryStore(connection)
        embedder = OpenAIEmbeddings(endpoint.openai_base_url, model="bench")
        for count in held:
            for strategy in ("recent", "keyword", "embedding_search"):
                fill(store, count)
                memory = AgentMemory(store, AGENT, config(strategy), embedder=embedder)
                summary, chars, items = recall_ms(memory, runs)
                tokens = round(chars / CHARS_PER_TOKEN)
                recall.add(count, strategy, *summary.cells(2), items, tokens)
                write.add(count, strategy, *write_ms(memory, runs).cells(2))
        store.forget(AGENT)
    recall.notes.append(
        "keyword and embedding_search rank the newest 1000 memories (SEARCH_WINDOW): the "
        "cost stops growing there"
    )
    recall.notes.append(
        "embedding_search includes one embeddings call for the task (loopback HTTP to the "
        "scripted endpoint); a real model adds its own inference time"
    )
    return [recall, write]
