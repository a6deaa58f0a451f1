"""A recording proxy in front of the model: every chat completion, request and answer.

``make eval`` with ``REALMODEL_RECORD=path.jsonl`` puts it between the worker and
llama-server; each line of the file is one ``{"request": ..., "response": ...}`` exchange,
which the tests replay as recorded real outputs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from worker.dev.post_proxy import forward_post, post_proxy

_TIMEOUT_S = 600


@contextmanager
def recording_proxy(upstream: str, record: Path) -> Iterator[str]:
    """Forward POSTs under ``upstream`` (ending in /v1) and log them; yields the proxy's /v1."""
    lock = threading.Lock()

    def handle(path: str, body: bytes) -> tuple[int, bytes]:
        status, payload = forward_post(upstream.removesuffix("/v1") + path, body, _TIMEOUT_S)
        with lock, record.open("a") as log:
            log.write(json.dumps(_exchange(body, status, payload)) + "\n")
        return status, payload

    with post_proxy(handle) as url:
        yield url + "/v1"


def exchanges(record: Path) -> list[dict[str, Any]]:
    """The exchanges a recording holds, in the order they were made."""
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def _exchange(request: bytes, status: int, response: bytes) -> dict[str, Any]:
    try:
        answer: Any = json.loads(response)
    except ValueError:
        answer = response.decode(errors="replace")
    return {"request": json.loads(request), "status": status, "response": answer}
