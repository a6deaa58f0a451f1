"""Recorded real model outputs, replayed to the real openai SDK through httpx2.MockTransport.

The files under ``tests/support/recorded`` are JSON lines written by ``make eval`` with
``REALMODEL_RECORD`` (or by hand against the same llama-server): one ``{"request",
"status", "response"}`` exchange per line, the response exactly as llama-server sent it.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

import httpx2

from worker.dev.realmodel._record import exchanges as recorded_exchanges
from worker.models import OpenAIModel

RECORDED = Path(__file__).resolve().parent / "recorded"


def exchanges(name: str) -> list[dict[str, Any]]:
    return recorded_exchanges(RECORDED / name)


class RecordedEndpoint:
    """Answers each chat completion with the next recorded response; keeps what was sent."""

    def __init__(self, recorded: list[dict[str, Any]]) -> None:
        self._answers: deque[dict[str, Any]] = deque(recorded)
        self.requests: list[dict[str, Any]] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(json.loads(request.content))
        exchange = self._answers.popleft()
        return httpx2.Response(exchange["status"], json=exchange["response"])

    def model(self, alias: str = "qwen2.5-coder-1.5b") -> OpenAIModel:
        client = httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))
        return OpenAIModel(
            alias, api_key="local", base_url="http://127.0.0.1:8080/v1", http_client=client
        )
