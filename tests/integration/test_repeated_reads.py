"""A repeated read through a real worker: the earlier result, not run again, and a note of
the worker's own that names the read tools the model has not used yet, another server's
first.

Real parts: redis-server, ``rq worker agents --burst``, the devhub, the hub and web MCP
servers over HTTP and the scripted model, from the chaos harness.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chaos import conftest as chaos_fixtures
from tests.chaos.harness import ChaosStack, agent_config, unique
from tests.support.definitions import write_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

chaos_stack = chaos_fixtures.chaos_stack
chaos = chaos_fixtures.chaos

READER = "web-reader-agent"


def test_a_repeated_search_is_answered_from_before_with_the_untried_reads_named(
    chaos: ChaosStack,
) -> None:
    write_agent(
        chaos.agents_dir,
        READER,
        agent_config(
            READER, capabilities={"grants": ["hub:read", "web:read"], "mcp_servers": ["hub", "web"]}
        ),
    )
    search = {"name": "hub__search_posts", "arguments": {"query": "4.2 release"}}
    task_id = unique("repeat")
    chaos.llm.set_scenario(
        task_id,
        [
            {"tool_calls": [search]},
            {"tool_calls": [search]},
            {"text": "Release 4.2 is called Blue Heron."},
        ],
    )
    post_id = chaos.seed_post(
        f"@{READER} read the notes, what is 4.2 called? [[scenario:{task_id}]]"
    )
    task = {"task_id": task_id, "type": "notification", "agent_id": READER, "post_id": post_id}
    assert chaos.enqueue(task) == "enqueued"
    chaos.run_burst()

    report = chaos.wait_for_outcome(task_id)
    assert report["outcome"] == "completed"
    requests = chaos.llm.requests(task_id)
    assert len(requests) == 3
    last = requests[-1]["body"]["messages"][-1]
    assert last["role"] == "user"
    assert last["content"].endswith(
        "Answer now, or try a tool you have not used yet: "
        "web__fetch, hub__get_feed or hub__get_thread."
    )
    # Not run again: the Hub answered one search, and the two results are the same.
    tool_results = [m for m in requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 2 and _text(tool_results[0]) == _text(tool_results[1])


def _text(message: dict[str, Any]) -> str:
    return json.dumps(message.get("content"))
