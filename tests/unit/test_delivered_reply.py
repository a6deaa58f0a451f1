"""A task whose reply reached the Hub is completed, never failed or error-posted.

The two runs a small real model made of ``make demo`` before the closing turn existed:
a notification that posts its reply through ``create_comment`` and then calls it again,
and an exploration that calls ``get_feed`` with the same arguments again and again.
Through the job pipeline, with the devhub in-process and a scripted model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from tests.support.pipeline import Harness, notification
from worker.loop import Closing, ToolCallRecord, ToolOutcome
from worker.models._scripted import ScriptedModel, Turn
from worker.pipeline._call_rules import DELIVERED_REASON, TaskCallRules
from worker.settings import Settings
from worker.task import Outcome, Task
from worker.tools import CallContext, LocalToolbox, load_mcp_config
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

REPLY = "Run more `rq worker agents` processes on each host; a job is handed to one worker."
MCP_CONFIG = """servers:
  hub:
    url: http://127.0.0.1:9/mcp
    tools: {get_feed: hub:read, create_comment: hub:write}
"""


class HubHarness(Harness):
    """The demo agent with two hub tools that act on the in-process devhub."""

    def __init__(self, tmp_path: Path, *, redis: fakeredis.FakeRedis) -> None:
        super().__init__([], redis=redis)
        config = tmp_path / "mcp.yaml"
        config.write_text(MCP_CONFIG)
        self.settings = Settings(
            hub_url="http://devhub", hub_api_key=self.settings.hub_api_key, mcp_config=config
        )  # type: ignore[arg-type]
        self.feed_reads: list[int] = []
        self.toolbox = LocalToolbox(hub_tools(self))

    def script(self, turns: list[Turn]) -> None:
        self.model = ScriptedModel(turns, name="gpt-4o-mini", provider="openai")


def hub_tools(h: HubHarness) -> list[LocalTool]:
    async def create_comment(post_id: str, content: str, ctx: CallContext) -> str:
        async with h.hub() as hub:
            created = await hub.create_comment(
                post_id, agent_id="demo-agent", content=content, idempotency_key=ctx.idempotency_key
            )
        return f"Created comment {created.id} on post {post_id}."

    def get_feed(limit: int = 20) -> str:
        h.feed_reads.append(limit)
        return "[post p-9] in m/general by alice: how do I scale workers?"

    return [
        LocalTool(name="hub__create_comment", function=create_comment, wants_context=True),
        LocalTool(name="hub__get_feed", function=get_feed),
    ]


def error_posts(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [post for post in state["posts"] if post["community"] == "m/agent-errors"]


async def test_a_reply_posted_through_a_tool_completes_the_task_once(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    h = HubHarness(tmp_path, redis=redis)
    post_id = await h.seed_post()
    call = ("hub__create_comment", {"post_id": post_id, "content": REPLY})
    h.script([Turn(tool_calls=[call]), Turn(tool_calls=[call])])  # the second: the closing turn
    verdict = await h.run(notification(post_id))
    report = verdict.report
    assert report.outcome is Outcome.COMPLETED and report.error is None
    assert report.output == REPLY and report.llm_calls == 2
    state = await h.state()
    assert [c["content"] for c in state["comments"]] == [REPLY]
    assert report.posted == [state["comments"][0]["id"]]
    assert not error_posts(state)
    assert not h.model.requests[-1].tools_callable  # the closing turn: none callable


async def test_an_exploration_repeating_its_feed_read_closes_with_an_answer(
    tmp_path: Path,
    redis: fakeredis.FakeRedis,
) -> None:
    h = HubHarness(tmp_path, redis=redis)
    read = ("hub__get_feed", {"limit": 5})
    summary = "Nothing in the feed needs me today; one question about scaling is answered."
    h.script([*(Turn(tool_calls=[read]) for _ in range(4)), Turn(text=summary)])
    verdict = await h.run({"task_id": "t-2", "type": "exploration", "agent_id": "demo-agent"})
    assert verdict.report.outcome is Outcome.COMPLETED
    assert h.feed_reads == [5]
    note = h.model.requests[2].messages[-1]
    assert note.role == "user" and "is the same as in step 1" in note.content
    assert not error_posts(await h.state())


def record(
    name: str, arguments: dict[str, Any], outcome: ToolOutcome, content: str
) -> ToolCallRecord:
    return ToolCallRecord(
        call_id="c1",
        name=name,
        arguments=json.dumps(arguments),
        server="hub",
        outcome=outcome,
        is_error=outcome is not ToolOutcome.OK,
        content=content,
    )


def test_which_writes_close_a_run(tmp_path: Path) -> None:
    config = tmp_path / "mcp.yaml"
    config.write_text(MCP_CONFIG)
    task = Task(task_id="t-1", type="notification", agent_id="demo-agent", post_id="p-1")
    rules = TaskCallRules(task, hub_server="hub", mcp_config=load_mcp_config(config))
    ok = ToolOutcome.OK
    reply = record("hub__create_comment", {"post_id": "p-1", "content": REPLY}, ok, "Created")
    assert rules.closing_after(reply) == Closing(reason=DELIVERED_REASON, delivered=REPLY)
    elsewhere = record("hub__create_comment", {"post_id": "p-2", "content": "hi"}, ok, "Created")
    assert rules.closing_after(elsewhere) is None  # not the reply to this thread
    refused = record(
        "hub__create_comment",
        {"post_id": "p-2", "content": "hi"},
        ToolOutcome.REFUSED,
        "Error: daily comment limit (1) reached",
    )
    assert rules.closing_after(refused) == Closing(
        reason="The Hub write was not made: daily comment limit (1) reached."
    )
    assert rules.closing_after(record("hub__get_feed", {}, ok, "[post p-9]")) is None
    assert rules.read_only("hub__get_feed") and not rules.read_only("hub__create_comment")
    assert not rules.read_only("web__fetch")  # not in this MCP_CONFIG
    exploration = Task(task_id="t-2", type="exploration", agent_id="demo-agent")
    explore_rules = TaskCallRules(exploration, hub_server="hub", mcp_config=None)
    assert explore_rules.closing_after(elsewhere) == Closing(
        reason=DELIVERED_REASON, delivered="hi"
    )
    assert not explore_rules.read_only("hub__get_feed")  # no MCP_CONFIG: nothing is read-only
