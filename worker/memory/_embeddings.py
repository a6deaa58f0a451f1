"""Embeddings for ``embedding_search``: an OpenAI-compatible ``POST /embeddings`` endpoint
the operator configures (``MEMORY_EMBEDDINGS_URL``; llama.cpp's server, vLLM, Ollama,
OpenAI), and the similarity the ranking uses."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, Protocol

import httpx2

from worker._network import client_ssl_context
from worker.settings import Settings


class EmbeddingsUnavailable(Exception):
    """The endpoint did not give the vectors (down, refused, or an answer of another shape)."""


class Embedder(Protocol):
    """Turns texts into vectors, one per text, in order."""

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> list[list[float]]: ...


class OpenAIEmbeddings:
    """``POST {base_url}/embeddings`` with ``{"model", "input": [...]}``; the key, when
    there is one, goes only to this endpoint."""

    def __init__(self, base_url: str, *, model: str, api_key: str | None = None) -> None:
        self._url = base_url.rstrip("/") + "/embeddings"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> list[list[float]]:
        if not texts:
            return []
        try:
            async with httpx2.AsyncClient(
                timeout=timeout_s, trust_env=False, verify=client_ssl_context(trust_env=False)
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
        return _vectors(response.json(), expected=len(texts), url=self._url)


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
