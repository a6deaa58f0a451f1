"""Who may act through our MCP servers, end to end through a real worker.

A signed per-task capability (CAPABILITY_KEY) is what lets a tool call act for an
agent: the bearer token alone, stolen, acts for nobody. A third-party server gets
only its own credentials, and a tool answer too large to hold is refused while it
streams, as an error result the model reads; the task goes on.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from mcp_types import RequestParamsMeta

from tests.chaos.harness import REPO_ROOT, ChaosStack, agent_config, unique
from tests.support.definitions import write_agent
from tests.support.mcp_servers import (
    RunningMcpServer,
    mcp_http_session,
    running_mcp,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

AGENT = "identity-agent"
RESULT_CAP = 1_000_000


@dataclass
class SecureFleet:
    """The chaos stack plus an mcp-hub that verifies capabilities and a recording
    third-party server, and the MCP_CONFIG naming them."""

    chaos: ChaosStack
    capability_key: str
    mcp_hub: RunningMcpServer
    record_file: Path
    mcp_config: Path

    def worker_env(self) -> dict[str, str]:
        return {
            "MCP_CONFIG": str(self.mcp_config),
            "CAPABILITY_KEY": self.capability_key,
            "MCP_RESULT_MAX_BYTES": str(RESULT_CAP),
        }

    def notify(self, prefix: str, turns: Callable[[str], list[dict[str, Any]]]) -> tuple[str, str]:
        """Seed a post for AGENT, script the model (``turns`` of the post id), enqueue the
        task answering the post; (task_id, post_id)."""
        task_id = unique(prefix)
        post_id = self.chaos.seed_post(f"@{AGENT} please help [[scenario:{task_id}]]")
        self.chaos.llm.set_scenario(task_id, turns(post_id))
        task = {"task_id": task_id, "type": "notification", "agent_id": AGENT, "post_id": post_id}
        assert self.chaos.enqueue(task) == "enqueued"
        return task_id, post_id


@pytest.fixture
def fleet(chaos: ChaosStack, tmp_path: Path) -> Iterator[SecureFleet]:
    key = secrets.token_hex(32)
    record_file = tmp_path / "third-party.jsonl"
    recorder_env = {"RECORD_FILE": str(record_file)}
    with (
        running_mcp(
            "hub",
            hub_url=chaos.hub.url,
            hub_api_key=chaos.canaries.hub_api_key,
            auth_token=chaos.canaries.mcp_auth_token,
            capability_key=key,
        ) as mcp_hub,
        running_mcp(
            "tests.support.mcp_test_servers.recorder", environment=recorder_env
        ) as recorder,
    ):
        mcp_config = tmp_path / "mcp.yaml"
        mcp_config.write_text(
            yaml.safe_dump(
                {
                    "servers": {
                        "hub": {
                            "url": mcp_hub.url,
                            "first_party": True,
                            "tools": {"get_thread": "hub:read", "create_comment": "hub:write"},
                        },
                        "rec": {"url": recorder.url, "tools": {"note": "rec:use"}},
                        "kit": {
                            "command": sys.executable,
                            "args": ["-m", "tests.support.mcp_test_servers.toolkit", "--stdio"],
                            "cwd": str(REPO_ROOT),
                            "tools": {"huge": "kit:use", "add": "kit:use"},
                        },
                    }
                }
            )
        )
        grants = {"grants": ["hub:read", "hub:write", "rec:use", "kit:use"], "mcp_servers": []}
        write_agent(chaos.agents_dir, AGENT, agent_config(AGENT, capabilities=grants))
        yield SecureFleet(
            chaos=chaos,
            capability_key=key,
            mcp_hub=mcp_hub,
            record_file=record_file,
            mcp_config=mcp_config,
        )


def comments_by(chaos: ChaosStack, agent_id: str) -> list[dict[str, Any]]:
    return [c for c in chaos.hub_state()["comments"] if c["author"]["id"] == agent_id]


def tool_results_seen_by_model(chaos: ChaosStack, task_id: str) -> list[str]:
    """The tool messages the model was sent in its later turns."""
    contents = []
    for request in chaos.llm.requests(task_id):
        for message in (request.get("body") or {}).get("messages", []):
            if message.get("role") == "tool":
                contents.append(str(message.get("content")))
    return contents


@pytest.mark.anyio
async def test_a_stolen_bearer_with_a_forged_agent_id_posts_nothing(fleet: SecureFleet) -> None:
    chaos = fleet.chaos
    post_id = chaos.seed_post("Who can restart the cluster?")
    forged = cast(
        RequestParamsMeta,
        {"agent_id": AGENT, "task_id": "t-forged", "idempotency_key": "t-forged:tool:1:0"},
    )
    async with mcp_http_session(
        fleet.mcp_hub.url, auth_token=chaos.canaries.mcp_auth_token
    ) as session:
        result = await session.call_tool(
            "create_comment", {"post_id": post_id, "content": "forged"}, meta=forged
        )
    assert result.is_error
    assert "no capability" in str(result.content[0])
    assert comments_by(chaos, AGENT) == []


def test_the_worker_acts_only_through_capabilities_and_keeps_third_parties_blind(
    fleet: SecureFleet,
) -> None:
    chaos, canaries = fleet.chaos, fleet.chaos.canaries
    wrote, wrote_post = fleet.notify(
        "cap-write",
        lambda post_id: [
            {
                "tool_calls": [
                    {
                        "name": "hub__create_comment",
                        "arguments": {"post_id": post_id, "content": "Restart with care."},
                    }
                ]
            },
            {"text": "Done."},
        ],
    )
    noted, _ = fleet.notify(
        "third-party",
        lambda _: [
            {"tool_calls": [{"name": "rec__note", "arguments": {"text": "hello"}}]},
            {"text": "Noted."},
        ],
    )
    oversized, _ = fleet.notify(
        "oversized",
        lambda _: [
            {"tool_calls": [{"name": "kit__huge", "arguments": {"megabytes": 40}}]},
            {"text": "That answer was too large."},
        ],
    )

    worker = chaos.run_burst(**fleet.worker_env())
    assert worker.process.returncode == 0, worker.stderr[-3000:]

    # The write went through the verified capability, as the task's agent.
    assert chaos.report(wrote)["outcome"] == "completed"
    assert [c["content"] for c in chaos.replies_to(wrote_post, AGENT)] == ["Restart with care."]
    assert not any("refused" in text for text in tool_results_seen_by_model(chaos, wrote))

    # The third-party server saw no credential and no capability of ours.
    assert chaos.report(noted)["outcome"] == "completed"
    recorded = fleet.record_file.read_text()
    assert '"kind": "meta"' in recorded
    for secret in (
        canaries.mcp_auth_token,
        canaries.hub_api_key,
        canaries.openai_api_key,
        fleet.capability_key,
    ):
        assert secret not in recorded
    for line in recorded.splitlines():
        entry = json.loads(line)
        if entry["kind"] == "headers":
            assert "authorization" not in entry["headers"]
        else:
            assert "capability" not in entry["meta"]

    # 40 MB answered: refused at the cap while streaming, told to the model, task completed.
    report = chaos.report(oversized)
    assert report["outcome"] == "completed"
    assert report["tool_calls"] == 1
    seen = tool_results_seen_by_model(chaos, oversized)
    assert any(
        f"kit__huge failed: result larger than {RESULT_CAP} bytes" in text for text in seen
    ), seen

    # The key never reached a log line, Redis or the Hub.
    assert fleet.capability_key not in worker.stderr
    assert fleet.capability_key.encode() not in chaos.redis_dump()
    assert fleet.capability_key not in json.dumps(chaos.hub_state())
