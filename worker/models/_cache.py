"""Prompt caching: what a provider needs to serve an agent's repeated prefix from its cache.

An agent loop sends its tools, the agent's prompt and skills, then the growing
conversation with every call. Providers discount a prefix they have seen: Anthropic
where the request marks it (``cache_control``, at most four breakpoints), OpenAI and
compatible servers on their own, kept on one machine by ``prompt_cache_key``. The
worker keeps that prefix byte-identical across an agent's tasks (``ModelRequest.system``
holds only the agent's prompt and skills; the per-task notice and budget line go in
``system_context``) and tells each provider where it is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

CacheTtl = Literal["5m", "1h"]

# Anthropic caches nothing shorter than this many prompt tokens (published per model).
# Longest prefix first: "claude-sonnet-4-5" must not match "claude-sonnet-4".
_ANTHROPIC_MINIMUM_TOKENS = (
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
    ("claude-sonnet-4-5", 1024),
    ("claude-opus-4-1", 1024),
    ("claude-opus-4", 1024),
    ("claude-sonnet-4", 1024),
    ("claude-3-7-sonnet", 1024),
)
# An unknown model: the smallest published minimum. A breakpoint below a model's real
# minimum costs nothing (the API caches and bills nothing for it); skipping one above it
# forgoes the discount.
_DEFAULT_MINIMUM_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class PromptCache:
    """How a model engages its provider's prompt cache; ``None`` in its place: not at all.

    ``key`` groups the requests that share a prefix (OpenAI's ``prompt_cache_key``, a hash
    of the agent's name); ``ttl`` is how long Anthropic keeps the agent's prompt and tools
    (the conversation's own breakpoints always take 5 minutes: a task's steps are seconds
    apart); ``send_key`` False for endpoints that refuse fields they do not know.
    """

    key: str = ""
    ttl: CacheTtl = "5m"
    send_key: bool = True


def agent_cache_key(agent_id: str) -> str:
    """A stable key for one agent's requests: the same in every process, not its name."""
    return "agent-" + hashlib.sha256(agent_id.encode()).hexdigest()[:24]


def anthropic_minimum_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches, in tokens."""
    name = model.strip().lower()
    for prefix, tokens in _ANTHROPIC_MINIMUM_TOKENS:
        if name.startswith(prefix):
            return tokens
    return _DEFAULT_MINIMUM_TOKENS
