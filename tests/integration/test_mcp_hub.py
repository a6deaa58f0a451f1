"""The real ``hub`` MCP server over streamable HTTP, in front of the real devhub."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any, cast

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParamsMeta as Meta

from mcp_servers.hub import PREVIEW_CHARS
from tests.support.devhub import DevHub, running_devhub
from tests.support.mcp_servers import (
    RunningMcpServer,
    caller_meta,
    mcp_http_session,
    running_mcp,
    text_of,
)
from tests.support.workers import parse_events, wait_until

pytestmark = pytest.mark.integration

HUB_KEY = "hub-key-for-mcp-tests-0123"
MCP_TOKEN = "mcp-token-for-tests-4567"


def caller(agent_id: str = "devops-agent", *, step: int = 1, task_id: str = "t-hub") -> Meta:
    return caller_meta(agent_id, task_id=task_id, step=step)


def as_meta(values: dict[str, str]) -> Meta:
    # mypy cannot read RequestParamsMeta's open keys (PEP 728), hence the cast.
    return cast(Meta, values)


@pytest.fixture(scope="module")
def devhub() -> Iterator[DevHub]:
    with running_devhub(api_key=HUB_KEY) as hub:
        yield hub


@pytest.fixture(scope="module")
def mcp_hub(devhub: DevHub) -> Iterator[RunningMcpServer]:
    with running_mcp(
        "hub", hub_url=devhub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN
    ) as server:
        yield server


@pytest.fixture
def hub(devhub: DevHub) -> DevHub:
    devhub.reset()
    return devhub


_seed_steps = itertools.count(1)


async def new_post(session: ClientSession, content: str, **fields: str) -> str:
    """Seed a post through the tool; each seed is its own write (own idempotency key)."""
    seed = caller("seed-agent", step=next(_seed_steps), task_id="t-seed")
    result = await session.call_tool("create_post", {"content": content, **fields}, meta=seed)
    assert not result.is_error, text_of(result)
    # "Created post p-1 in m/devops."
    return text_of(result).split()[2].rstrip(".")


@pytest.mark.anyio
async def test_the_server_reports_its_name_and_the_package_version(
    mcp_hub: RunningMcpServer,
) -> None:
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        info = (await session.initialize()).server_info
    assert (info.name, info.version) == ("hub", version("hub-agent-worker"))


@pytest.mark.anyio
async def test_a_call_the_client_cancels_is_logged_as_cancelled_not_as_an_error(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    hub.inject_faults(None, 1, path_prefix="/api/v1/search", delay_s=5)
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        with anyio.move_on_after(1):  # the worker's tool deadline, say
            await session.call_tool("search_posts", {"query": "slow"}, meta=caller("slow-agent"))
        calls = await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: tool_calls(mcp_hub, "slow-agent"), 10, "its tool_call")
        )

    (call,) = calls
    assert (call["tool"], call["outcome"], call["level"]) == ("search_posts", "cancelled", "info")


def tool_calls(server: RunningMcpServer, agent: str) -> list[dict[str, Any]]:
    return [
        event
        for event in parse_events(server.stderr_text(), "tool_call")
        if event.get("agent") == agent
    ]


@pytest.mark.anyio
async def test_create_comment_acts_for_the_caller_and_a_replay_creates_nothing(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        post_id = await new_post(session, "Pods keep restarting", community="m/devops")
        arguments = {"post_id": post_id, "content": "Check the liveness probe."}
        first = await session.call_tool("create_comment", arguments, meta=caller("sre-agent"))
        replay = await session.call_tool("create_comment", arguments, meta=caller("sre-agent"))

    assert not first.is_error, text_of(first)
    assert text_of(first) == text_of(replay)
    state = hub.state()
    assert [(c["post_id"], c["author"]["id"], c["content"]) for c in state["comments"]] == [
        (post_id, "sre-agent", "Check the liveness probe.")
    ]
    assert text_of(first) == f"Created comment {state['comments'][0]['id']} on post {post_id}."
    assert state["replays"] == 1


@pytest.mark.anyio
async def test_create_post_publishes_in_the_community_as_the_caller(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        result = await session.call_tool(
            "create_post",
            {"content": "Weekly digest", "title": "Digest", "community": "m/devops"},
            meta=caller("digest-agent"),
        )

    assert not result.is_error, text_of(result)
    [post] = hub.state()["posts"]
    assert (post["author"]["id"], post["title"], post["community"]) == (
        "digest-agent",
        "Digest",
        "m/devops",
    )
    assert text_of(result) == f"Created post {post['id']} in m/devops."


@pytest.mark.anyio
async def test_search_and_get_thread_show_ids_authors_titles_and_content(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        wanted = await new_post(session, "Kubernetes pods restart", title="Restarts")
        await new_post(session, "Lunch menu for Friday", title="Lunch")
        await session.call_tool(
            "create_comment",
            {"post_id": wanted, "content": "Look at OOMKilled events."},
            meta=caller("sre-agent"),
        )
        found = await session.call_tool("search_posts", {"query": "kubernetes"})
        thread = await session.call_tool("get_thread", {"post_id": wanted})

    assert not found.is_error and not thread.is_error
    assert f"[{wanted}]" in text_of(found)
    assert "Title: Restarts" in text_of(found)
    assert "Lunch" not in text_of(found)
    assert "Kubernetes pods restart" in text_of(thread)
    assert "by sre-agent" in text_of(thread)
    assert "Look at OOMKilled events." in text_of(thread)


@pytest.mark.anyio
async def test_a_preview_cut_never_halves_a_word_so_the_worker_can_mask_a_key_whole(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    # The server does not know the worker's keys: a cut inside one would hand the worker a
    # fragment its redactor cannot recognise. The preview stops before the key instead.
    key = "sk-worker-only-key-0123456789abcdef"
    content = "x" * (PREVIEW_CHARS - 20) + f" {key} and more words after it"
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        await new_post(session, content, title="Preview")
        found = text_of(await session.call_tool("search_posts", {"query": "Preview"}))

    assert "x" * (PREVIEW_CHARS - 20) + "… [" in found
    assert key[:6] not in found


@pytest.mark.anyio
async def test_get_feed_leaves_out_posts_the_caller_already_answered(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        answered = await new_post(session, "Kubernetes upgrade plan", community="m/devops")
        fresh = await new_post(session, "Kubernetes cost report", community="m/devops")
        await session.call_tool(
            "create_comment", {"post_id": answered, "content": "LGTM"}, meta=caller("sre-agent")
        )
        feed = await session.call_tool(
            "get_feed", {"communities": ["m/devops"]}, meta=caller("sre-agent", step=2)
        )

    assert not feed.is_error, text_of(feed)
    assert f"[{fresh}]" in text_of(feed)
    assert f"[{answered}]" not in text_of(feed)


@pytest.mark.anyio
async def test_a_hub_error_comes_back_as_an_error_result_without_keys(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    meta = caller()
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        missing = await session.call_tool("get_thread", {"post_id": "p-does-not-exist"})
        on_missing = await session.call_tool(
            "create_comment", {"post_id": "p-does-not-exist", "content": "hello"}, meta=meta
        )

    assert missing.is_error
    assert "not found on the Hub" in text_of(missing)
    assert on_missing.is_error
    assert "not found on the Hub" in text_of(on_missing)
    assert "post_id must be the id of a post" in text_of(on_missing)
    for result in (missing, on_missing):
        assert HUB_KEY not in text_of(result)
        assert "t-hub:tool:1:0" not in text_of(result)
    assert hub.state()["comments"] == []


@pytest.mark.anyio
async def test_a_write_without_caller_meta_is_refused_and_writes_nothing(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        post_id = await new_post(session, "Anyone around?")
        anonymous = await session.call_tool("create_comment", {"post_id": post_id, "content": "hi"})
        partial = await session.call_tool(
            "create_post", {"content": "hi"}, meta=as_meta({"agent_id": "devops-agent"})
        )

    assert anonymous.is_error and partial.is_error
    assert "refused: create_comment" in text_of(anonymous)
    assert "_meta" in text_of(anonymous)
    assert "refused: create_post" in text_of(partial)
    state = hub.state()
    assert state["comments"] == []
    assert len(state["posts"]) == 1


@pytest.mark.anyio
async def test_http_requests_without_the_bearer_token_get_401(mcp_hub: RunningMcpServer) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(trust_env=False, timeout=10) as client:
        without = await client.post(mcp_hub.url, json=initialize, headers=headers)
        wrong = await client.post(
            mcp_hub.url, json=initialize, headers={**headers, "Authorization": "Bearer nope"}
        )
        right = await client.post(
            mcp_hub.url,
            json=initialize,
            headers={**headers, "Authorization": f"Bearer {MCP_TOKEN}"},
        )

    assert without.status_code == 401
    assert wrong.status_code == 401
    assert without.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200


@pytest.mark.anyio
async def test_an_mcp_client_without_the_token_cannot_open_a_session(
    mcp_hub: RunningMcpServer,
) -> None:
    with pytest.raises(BaseExceptionGroup) as failure:
        async with mcp_http_session(mcp_hub.url, auth_token=None):
            pass

    assert failure.group_contains(MCPError)


@pytest.mark.anyio
async def test_the_hub_key_never_reaches_results_or_logs(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    # A call of this test's own on the well-configured server, whatever else ran in this process.
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        found = await session.call_tool("search_posts", {"query": "anything"})
    assert not found.is_error
    with running_mcp(
        "hub", hub_url=hub.url, hub_api_key="wrong-hub-key-98765", auth_token=MCP_TOKEN
    ) as misconfigured:
        async with mcp_http_session(misconfigured.url, auth_token=MCP_TOKEN) as session:
            refused = await session.call_tool("search_posts", {"query": "anything"})
        misconfigured_log = misconfigured.stderr_text()

    assert refused.is_error
    assert "refused this server's credentials" in text_of(refused)
    assert "wrong-hub-key-98765" not in text_of(refused)
    assert "wrong-hub-key-98765" not in misconfigured_log
    assert MCP_TOKEN not in misconfigured_log
    assert HUB_KEY not in mcp_hub.stderr_text()
    assert '"event": "tool_call"' in mcp_hub.stderr_text()
