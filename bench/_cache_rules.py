"""Two providers' prompt caches, as their published rules describe them, for ``prompt_cache``.

Anthropic (Messages API, "Prompt caching"): the prompt is read as tools, then system, then
messages; a request marks at most four blocks with ``cache_control``, and each mark asks
for the prefix up to and including that block to be cached. A mark whose prefix is shorter
than the model's minimum caches nothing. On a request, each mark looks for a cached prefix
ending at its block or at one of the ~20 block boundaries before it; the longest one found
is read (``cache_read_input_tokens``, billed 0.1x the input price), and the prefix from
there up to the last cacheable mark is written (``cache_creation_input_tokens``, 1.25x for a
5-minute entry, 2x for a 1-hour one); the rest is ``input_tokens``. An entry lives for its
TTL from its last use: a read refreshes it for free. A 1-hour mark may not follow a
5-minute one.

OpenAI (Chat Completions, "Prompt caching"): automatic for prompts of 1,024 tokens or more.
A request goes to a machine chosen by a hash of the prompt's first 256 tokens and its
``prompt_cache_key``; beyond about 15 requests a minute for one such pair, some spill to
other machines. The machine serves from cache the longest prefix it has seen, counted in
steps of 128 tokens from 1,024 (``prompt_tokens_details.cached_tokens``, included in
``prompt_tokens``); an entry is dropped after 5 to 10 minutes unused (5 here).

Tokens are counted as one per 4 characters of each block's JSON text, the usual size of
English and JSON for both providers' tokenizers; both caches and the uncached baseline
count the same way, so the shares and ratios do not depend on it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CHARS_PER_TOKEN = 4
ANTHROPIC_MAX_BREAKPOINTS = 4
ANTHROPIC_LOOKBACK_BLOCKS = 20
ANTHROPIC_TTL_S = {"5m": 300.0, "1h": 3600.0}
OPENAI_MINIMUM_TOKENS = 1024
OPENAI_STEP_TOKENS = 128
OPENAI_ROUTING_TOKENS = 256
OPENAI_RETENTION_S = 300.0
OPENAI_OVERFLOW_PER_MINUTE = 15
OPENAI_MACHINES = 16


def tokens_of(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


class CacheRuleError(ValueError):
    """A request the provider would refuse (answered 400)."""


@dataclass(frozen=True, slots=True)
class AnthropicUsage:
    input_tokens: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def total(self) -> int:
        return self.input_tokens + self.cache_read + self.cache_write

    def wire(self, output_tokens: int) -> dict[str, Any]:
        """The ``usage`` object as the Messages API sends it."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": output_tokens,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_write,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_write_5m,
                "ephemeral_1h_input_tokens": self.cache_write_1h,
            },
            "service_tier": "standard",
        }


@dataclass(frozen=True, slots=True)
class _Block:
    text: str  # the block's canonical JSON, cache_control left out
    ttl: str | None  # the block's mark: "5m", "1h", or None


def anthropic_blocks(body: Mapping[str, Any]) -> list[_Block]:
    """The request's blocks in the order the cache reads them: tools, system, messages."""
    blocks: list[_Block] = []

    def add(block: Mapping[str, Any], prefix: str = "") -> None:
        mark = block.get("cache_control")
        ttl = None
        if mark is not None:
            ttl = str(mark.get("ttl", "5m"))
            if ttl not in ANTHROPIC_TTL_S:
                raise CacheRuleError(f"cache_control ttl {ttl!r} is not 5m or 1h")
        bare = {key: value for key, value in block.items() if key != "cache_control"}
        blocks.append(_Block(prefix + _canonical(bare), ttl))

    for tool in body.get("tools") or ():
        add(tool, "tool:")
    system = body.get("system")
    if isinstance(system, str):
        add({"type": "text", "text": system}, "system:")
    else:
        for block in system or ():
            add(block, "system:")
    for turn in body.get("messages") or ():
        content = turn["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content:
            add(block, f"{turn['role']}:")
    return blocks


@dataclass
class AnthropicCache:
    """One organisation's Anthropic cache for one model; ``request`` bills one request."""

    minimum_tokens: int
    # prefix hash -> (expires at, ttl seconds)
    _entries: dict[str, tuple[float, float]] = field(default_factory=dict)

    def request(self, body: Mapping[str, Any], now: float) -> AnthropicUsage:
        blocks = anthropic_blocks(body)
        marks = [index for index, block in enumerate(blocks) if block.ttl is not None]
        if len(marks) > ANTHROPIC_MAX_BREAKPOINTS:
            raise CacheRuleError(f"{len(marks)} cache_control blocks; at most 4")
        ttls = [blocks[index].ttl for index in marks]
        if "5m" in ttls and "1h" in ttls[ttls.index("5m") :]:
            raise CacheRuleError("a 1h cache_control block after a 5m one")
        ends: list[int] = []  # tokens up to and including each block
        hashes: list[str] = []
        digest = hashlib.sha256()
        total = 0
        for block in blocks:
            digest.update(block.text.encode() + b"\x00")
            hashes.append(digest.hexdigest())
            total += tokens_of(block.text)
            ends.append(total)
        read_at = -1  # the last block of the longest cached prefix found
        for mark in marks:
            for index in range(mark, max(-1, mark - ANTHROPIC_LOOKBACK_BLOCKS - 1), -1):
                if self._alive(hashes[index], now):
                    read_at = max(read_at, index)
                    break
        read = ends[read_at] if read_at >= 0 else 0
        if read_at >= 0:
            _, ttl_s = self._entries[hashes[read_at]]
            self._entries[hashes[read_at]] = (now + ttl_s, ttl_s)
        written = {"5m": 0, "1h": 0}
        start = read
        for mark in marks:
            ttl = blocks[mark].ttl
            assert ttl is not None
            if mark <= read_at or ends[mark] < self.minimum_tokens:
                continue
            written[ttl] += ends[mark] - start
            start = ends[mark]
            self._entries[hashes[mark]] = (now + ANTHROPIC_TTL_S[ttl], ANTHROPIC_TTL_S[ttl])
        return AnthropicUsage(
            input_tokens=total - read - written["5m"] - written["1h"],
            cache_read=read,
            cache_write_5m=written["5m"],
            cache_write_1h=written["1h"],
        )

    def _alive(self, prefix: str, now: float) -> bool:
        entry = self._entries.get(prefix)
        return entry is not None and entry[0] >= now


def openai_prompt(body: Mapping[str, Any]) -> str:
    """The prompt as one text, tools first, then each message (what the prefix match reads)."""
    parts = [_canonical(tool) for tool in body.get("tools") or ()]
    parts += [_canonical(message) for message in body.get("messages") or ()]
    return "\n".join(parts)


@dataclass
class _Machine:
    prompts: dict[str, float] = field(default_factory=dict)  # prompt -> last used


@dataclass
class OpenAICache:
    """OpenAI's automatic cache over a pool of machines; ``request`` gives
    ``(prompt_tokens, cached_tokens)`` for one request."""

    machines: int = OPENAI_MACHINES
    _spill: random.Random = field(default_factory=lambda: random.Random(0))
    _pool: dict[int, _Machine] = field(default_factory=dict)
    _recent: dict[str, list[float]] = field(default_factory=dict)  # route -> request times

    def request(self, body: Mapping[str, Any], now: float) -> tuple[int, int]:
        prompt = openai_prompt(body)
        prompt_tokens = tokens_of(prompt)
        key = str(body.get("prompt_cache_key") or "")
        route = hashlib.sha256(
            (prompt[: OPENAI_ROUTING_TOKENS * CHARS_PER_TOKEN] + "\x00" + key).encode()
        ).hexdigest()
        recent = [t for t in self._recent.get(route, []) if now - t < 60.0]
        recent.append(now)
        self._recent[route] = recent
        home = int(route[:8], 16)
        if len(recent) > OPENAI_OVERFLOW_PER_MINUTE:
            # Spilled: any machine of the pool (seeded, so runs repeat).
            home += self._spill.randrange(1, self.machines)
        machine = self._pool.setdefault(home % self.machines, _Machine())
        machine.prompts = {
            seen: used for seen, used in machine.prompts.items() if now - used <= OPENAI_RETENTION_S
        }
        longest, matched = 0, ""
        for seen in machine.prompts:
            shared = _shared_prefix(seen, prompt)
            if shared > longest:
                longest, matched = shared, seen
        cached = cached_tokens(prompt_tokens, longest // CHARS_PER_TOKEN)
        if matched and cached:
            machine.prompts[matched] = now
        if prompt_tokens >= OPENAI_MINIMUM_TOKENS:
            machine.prompts[prompt] = now
        return prompt_tokens, cached

    @staticmethod
    def wire(prompt_tokens: int, cached: int, completion_tokens: int) -> dict[str, Any]:
        """The ``usage`` object as Chat Completions sends it."""
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }


def cached_tokens(prompt_tokens: int, shared_tokens: int) -> int:
    """What OpenAI serves from cache of a ``prompt_tokens`` prompt sharing ``shared_tokens``
    with one it has seen: nothing under 1,024, then 1,024 plus whole 128-token steps."""
    shared = min(shared_tokens, prompt_tokens)
    if prompt_tokens < OPENAI_MINIMUM_TOKENS or shared < OPENAI_MINIMUM_TOKENS:
        return 0
    steps = (shared - OPENAI_MINIMUM_TOKENS) // OPENAI_STEP_TOKENS
    return OPENAI_MINIMUM_TOKENS + steps * OPENAI_STEP_TOKENS


def _shared_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two texts (binary search on slices: C-speed compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
