"""Deterministic embeddings for ``POST /v1/embeddings`` (OpenAI's shape), so tests and the
demo can use agent memory's ``embedding_search`` without a model.

Each word of a text (lower-cased, three characters or more) adds a fixed ±1 to one of
``DIMENSIONS`` positions chosen by its hash; the vector is then scaled to length 1. Texts
sharing words are therefore close (cosine near the share of words they have in common)
and texts sharing none are near 0: a stand-in for meaning that a test can reason about.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from typing import Any

DIMENSIONS = 256
SCENARIO = "embeddings"
_WORD = re.compile(r"[a-z0-9][a-z0-9_-]{2,}")


def embedding(text: str) -> list[float]:
    vector = [0.0] * DIMENSIONS
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
        position = int.from_bytes(digest[:2], "big") % DIMENSIONS
        vector[position] += 1.0 if digest[2] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [round(x / norm, 6) for x in vector] if norm else vector


def embeddings_answer(model: str, inputs: Sequence[str]) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": index, "embedding": embedding(text)}
        for index, text in enumerate(inputs)
    ]
    tokens = sum(len(text.split()) for text in inputs)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
