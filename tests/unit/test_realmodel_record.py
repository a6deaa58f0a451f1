"""``make eval``'s recording proxy: each exchange with the model, as the model answered it."""

from __future__ import annotations

import json
from pathlib import Path

from worker.dev.post_proxy import forward_post, post_proxy
from worker.dev.realmodel._eval import prompt_tokens
from worker.dev.realmodel._record import exchanges, recording_proxy


def test_every_exchange_is_recorded_and_its_prompt_tokens_read_back(tmp_path: Path) -> None:
    answers = {"/v1/chat/completions": (200, {"timings": {"prompt_n": 40, "cache_n": 900}})}

    def model(path: str, body: bytes) -> tuple[int, bytes]:
        status, answer = answers.get(path, (404, {"error": "no such path"}))
        return status, json.dumps(answer).encode()

    record = tmp_path / "exchanges.jsonl"
    request = {"messages": [{"role": "user", "content": "in the thread of post p-3."}]}
    with post_proxy(model) as upstream, recording_proxy(upstream + "/v1", record) as proxy:
        sent = json.dumps(request).encode()
        answered = forward_post(proxy + "/chat/completions", sent, 10.0)
        missing = forward_post(proxy + "/nothing", sent, 10.0)

    assert answered == (200, json.dumps(answers["/v1/chat/completions"][1]).encode())
    assert missing[0] == 404
    recorded = exchanges(record)
    assert [exchange["status"] for exchange in recorded] == [200, 404]
    assert recorded[0]["request"] == request
    assert prompt_tokens(recorded, "p-3") == (40, 900)
