"""Redact, then cut, at the context-window fit: through ``rq worker agents`` and the
scripted endpoint.

The model's own earlier turns reach the redactor only at the model boundary, after the
window fit has cut them; a cut that falls inside a secret the model echoed would leave a
prefix the redactor no longer recognises. The memory clips have the same test
(tests/integration/test_agent_memory_e2e.py: a key cut at the boundary).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.definitions import write_agent
from tests.support.e2e import E2E

pytestmark = pytest.mark.integration

AGENT = "window-echo"
CONFIG = f"""
name: {AGENT}
type: native
brain: {{provider: openai, model: {AGENT}, max_tokens: 300, max_context_tokens: 4096}}
capabilities: {{grants: [hub:read], mcp_servers: [hub]}}
behavior:
  limits: {{max_daily_comments: 10000, max_responses_per_thread: 10000, min_interval_seconds: 0}}
limits: {{max_tokens: 100000, max_duration_s: 60}}
"""
# Where the window fit cuts a message of 6,000 characters or more: after its head.
HEAD_CHARS = 1_500
MASK = "[REDACTED]"
CUT_MARKER = "characters of older content left out to fit the model's context window"


def echoing(secret: str) -> str:
    """8,000 characters of the model's own text, ``secret`` starting 15 before the cut."""
    before = "I checked the notes. " * (HEAD_CHARS // 21 + 1)
    before = before[: HEAD_CHARS - 15]
    text = before + secret + " " + "and the rest is fine. " * 900
    assert text.index(secret) == HEAD_CHARS - 15 and len(text) > 6_000
    return text[:8_000]


def test_a_secret_the_model_echoed_is_masked_whole_before_the_window_cuts_its_turn(
    e2e: E2E, tmp_path: Path
) -> None:
    write_agent(tmp_path, AGENT, CONFIG, prompt="You are a window test agent. Answer briefly.")
    known = e2e.stack.hub_api_key  # a secret the worker holds
    shaped = "sk-canary-llm-7f3a9b2c4d5e6f708192"  # one it only knows by its shape
    search = {"name": "hub__search_posts", "arguments": {"query": "notes"}}
    e2e.llm.set_scenario(
        AGENT,
        [
            {"text": echoing(known), "tool_calls": [search]},
            {"text": echoing(shaped), "tool_calls": [search]},
            {"text": "All checked."},
        ],
    )
    post = e2e.hub.create_post(agent_id="ron", content=f"Hey @{AGENT}, check the notes.")
    task = {"task_id": "echo-1", "type": "notification", "agent_id": AGENT, "post_id": post["id"]}
    assert e2e.enqueue(task) == "enqueued"
    burst = e2e.run_burst(AGENTS_DIR=str(tmp_path))
    assert burst.returncode == 0, burst.stderr[-3000:]

    assert e2e.report("echo-1")["outcome"] == "completed"
    requests = e2e.llm.requests(AGENT)
    assert len(requests) == 3
    # The last request carries both of the model's earlier turns, each cut once at its head,
    # where the secret was (the window fits the first turn whole in the second request).
    turns = [
        str(message.get("content"))
        for message in requests[-1]["body"]["messages"]
        if message.get("role") == "assistant"
    ]
    assert len(turns) == 2 and [turn.count(CUT_MARKER) for turn in turns] == [1, 1]
    sent = "".join(str(request["body"]) for request in requests)
    assert known[:10] not in sent and shaped[:9] not in sent
    assert [turn.find(MASK) for turn in turns] == [HEAD_CHARS - 15, HEAD_CHARS - 15]
