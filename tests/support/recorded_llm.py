"""Recorded real model outputs, replayed to the real openai SDK through the tests' FakeProvider.

The files under ``tests/support/recorded`` are JSON lines written by ``make eval`` with
``REALMODEL_RECORD`` (or by hand against the same llama-server): one ``{"request",
"status", "response"}`` exchange per line, the response exactly as llama-server sent it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2

from tests.support.provider_wire import FakeProvider
from worker.dev.realmodel._record import exchanges as recorded_exchanges
from worker.models._openai import OpenAIModel

RECORDED = Path(__file__).resolve().parent / "recorded"


def exchanges(name: str) -> list[dict[str, Any]]:
    return recorded_exchanges(RECORDED / name)


def replaying(recorded: list[dict[str, Any]]) -> FakeProvider:
    """A fake provider answering each chat completion with the next recorded response."""
    return FakeProvider(*(httpx2.Response(e["status"], json=e["response"]) for e in recorded))


def local_model(fake: FakeProvider, alias: str = "qwen2.5-coder-1.5b") -> OpenAIModel:
    """The model ``make eval`` asks, as the worker builds it for llama-server, on ``fake``."""
    return OpenAIModel(
        alias, api_key="local", base_url="http://127.0.0.1:8080/v1", http_client=fake.client()
    )
