"""Embeddings for ``embedding_search``: an OpenAI-compatible ``POST /embeddings`` endpoint
the operator configures (``MEMORY_EMBEDDINGS_URL``; llama.cpp's server, vLLM, Ollama,
OpenAI), and the similarity the ranking uses.

An embeddings call is model spend: each answer carries the tokens the endpoint counted
(``usage.total_tokens``; an estimate from the texts' size when it reports none), and the
pipeline adds them to the task's usage and holds them within its ``max_tokens``."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2

from worker._network import client_ssl_context
from worker._tokens import CHARS_PER_TOKEN
from worker.settings import Settings

# What the estimate adds for tokenisation it cannot see (as the loop's request estimate).
_ESTIMATE_MARGIN = 0.15


class EmbeddingsUnavailable(Exception):
    """The endpoint did not give the vectors (down, refused, or an answer of another shape)."""


@dataclass(frozen=True, kw_only=True)
class Embedded:
    """The vectors of one call, one per text in order, and the tokens it spent."""

    vectors: list[list[float]]
    tokens: int


class Embedder(Protocol):
    """Turns texts into vectors, one per text, in order, saying what that spent."""

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> Embedded: ...


def estimated_tokens(texts: Sequence[str]) -> int:
    """The tokens embedding ``texts`` may spend, on the safe side: what a call is checked
    against the task's remaining ``max_tokens`` with before it is made."""
    chars = sum(len(text) for text in texts)
    return math.ceil(chars / CHARS_PER_TOKEN * (1 + _ESTIMATE_MARGIN)) if chars else 0


class OpenAIEmbeddings:
    """``POST {base_url}/embeddings`` with ``{"model", "input": [...]}``; the key, when
    there is one, goes only to this endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + "/embeddings"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Tests answer through a transport fake; the worker uses the network.
        self._transport = transport

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> Embedded:
        if not texts:
            return Embedded(vectors=[], tokens=0)
        try:
            async with httpx2.AsyncClient(
                timeout=timeout_s,
                trust_env=False,
                verify=client_ssl_context(trust_env=False),
                transport=self._transport,
            ) as client:
                response = await client.post(
                    self._url,
                    json={"model": self._model, "input": list(texts)},
                    headers=self._headers,
                )
        except httpx2.HTTPError as exc:
            raise EmbeddingsUnavailable(f"{self._url}: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise EmbeddingsUnavailable(f"{self._url} answered {response.status_code}")
        body = response.json()
        vectors = _vectors(body, expected=len(texts), url=self._url)
        return Embedded(vectors=vectors, tokens=_tokens(body) or estimated_tokens(texts))


def embedder_from_settings(settings: Settings) -> OpenAIEmbeddings | None:
    """The operator's endpoint (``MEMORY_EMBEDDINGS_URL``), or None when none is set."""
    if settings.memory_embeddings_url is None:
        return None
    key = settings.memory_embeddings_api_key
    return OpenAIEmbeddings(
        settings.memory_embeddings_url,
        model=settings.memory_embeddings_model,
        api_key=key.get_secret_value() if key else None,
    )


def _vectors(body: Any, *, expected: int, url: str) -> list[list[float]]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        raise EmbeddingsUnavailable(f"{url}: the answer holds no {expected} embedding(s)")
    # The answer's items carry their input's index; the order is not promised.
    ordered = sorted(data, key=lambda item: item.get("index", 0) if isinstance(item, dict) else 0)
    vectors = []
    for item in ordered:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list) or not all(isinstance(x, int | float) for x in vector):
            raise EmbeddingsUnavailable(f"{url}: an embedding is not a list of numbers")
        vectors.append([float(x) for x in vector])
    return vectors


def _tokens(body: dict[str, Any]) -> int:
    """The tokens the endpoint counted (OpenAI's ``usage``; llama.cpp and vLLM report it
    too), or 0 when it did not say: the caller then estimates, since unknown is not free."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0
    for name in ("total_tokens", "prompt_tokens"):
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def unit(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1 (a zero vector stays zero). Memories are stored so:
    ranking then takes one dot product per memory instead of a cosine."""
    norm = math.sqrt(sum(map(operator.mul, vector, vector)))
    return [x / norm for x in vector] if norm else list(vector)


def dot(left: Sequence[float], right: Sequence[float]) -> float:
    """The dot product (the cosine of two unit vectors); 0 for vectors of different sizes."""
    return sum(map(operator.mul, left, right)) if len(left) == len(right) else 0.0


def cosine(left: Sequence[float], right: Sequence[float]) -> float:
    """Cosine similarity; 0 for vectors of different sizes (written by another model)."""
    if len(left) != len(right) or not left:
        return 0.0
    # map(mul) runs in C: about three times faster than a generator over zip().
    dot = sum(map(operator.mul, left, right))
    norms = math.sqrt(sum(map(operator.mul, left, left)) * sum(map(operator.mul, right, right)))
    return dot / norms if norms else 0.0
