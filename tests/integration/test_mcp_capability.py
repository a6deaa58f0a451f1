"""Our servers with CAPABILITY_KEY: identity and grants come from the signed capability only."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast
from urllib.parse import quote

import jwt
import pytest
from mcp_types import RequestParamsMeta

from tests.support.devhub import DevHub, running_devhub
from tests.support.loopback_web import loopback_host
from tests.support.mcp_servers import (
    RunningMcpServer,
    caller_meta,
    mcp_http_session,
    running_mcp,
    server_environment,
    text_of,
)
from worker.tools import Reach
from worker.tools._capability import AUDIENCE, mint_capability
from worker.tools._grants import EffectiveGrants
from worker.tools._scope import TaskScope

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HUB_KEY = "hub-key-for-capability-tests-1"
MCP_TOKEN = "mcp-token-for-capability-tests"
CAPABILITY_KEY = "c" * 40
TASK = "t-cap"
ANYWHERE = TaskScope(comment_on=None, post_in=None)


def capability(
    agent_id: str = "agent-a",
    *,
    grants: tuple[str, ...] = ("hub:read", "hub:write"),
    expires_in_s: float = 300,
    key: str = CAPABILITY_KEY,
    task_id: str = TASK,
    # Anywhere, unless a test is about the scope.
    scope: TaskScope = ANYWHERE,
) -> str:
    return mint_capability(
        key,
        agent_id=agent_id,
        task_id=task_id,
        grants=EffectiveGrants.of(list(grants)),
        expires_at=time.time() + expires_in_s,
        scope=scope,
    )


def meta(token: str | None, *, agent_id: str = "agent-a", step: int = 1) -> RequestParamsMeta:
    return caller_meta(agent_id, task_id=TASK, step=step, capability=token)


@pytest.fixture(scope="module")
def devhub() -> Iterator[DevHub]:
    with running_devhub(api_key=HUB_KEY) as hub:
        yield hub


@pytest.fixture(scope="module")
def mcp_hub(devhub: DevHub) -> Iterator[RunningMcpServer]:
    with running_mcp(
        "hub",
        hub_url=devhub.url,
        hub_api_key=HUB_KEY,
        auth_token=MCP_TOKEN,
        capability_key=CAPABILITY_KEY,
    ) as server:
        yield server


@pytest.fixture
def hub(devhub: DevHub) -> DevHub:
    devhub.reset()
    return devhub


async def test_a_stolen_bearer_with_forged_meta_posts_nothing(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    post_id = hub.seed_post("Help?")
    arguments = {"post_id": post_id, "content": "I am the admin agent"}
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        forged = await session.call_tool(
            "create_comment", arguments, meta=meta(None, agent_id="admin-agent")
        )
        reading = await session.call_tool("search_posts", {"query": "Help"}, meta=meta(None))
    assert forged.is_error
    assert "refused: no capability in the request _meta" in text_of(forged)
    assert reading.is_error
    assert hub.state()["comments"] == []


async def test_identity_comes_from_the_capability_not_from_meta(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    post_id = hub.seed_post("Help?")
    arguments = {"post_id": post_id, "content": "hello"}
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        # A capability for agent-a with _meta naming agent-b acts as agent-a.
        result = await session.call_tool(
            "create_comment", arguments, meta=meta(capability("agent-a"), agent_id="agent-b")
        )
    assert not result.is_error, text_of(result)
    assert [c["author"]["id"] for c in hub.state()["comments"]] == ["agent-a"]


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (lambda: capability(expires_in_s=-60), "the capability has expired"),
        (lambda: capability(key="x" * 40), "signature does not verify"),
        (lambda: capability()[:-4] + "AAAA", "signature does not verify"),
        (lambda: _forged_unsigned(), "the capability is not valid"),
        (lambda: "not-a-jwt", "the capability is not valid"),
    ],
    ids=["expired", "other-key", "tampered", "alg-none", "garbage"],
)
async def test_expired_or_tampered_capabilities_are_refused(
    hub: DevHub, mcp_hub: RunningMcpServer, token: Any, expected: str
) -> None:
    post_id = hub.seed_post("Help?")
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        result = await session.call_tool(
            "create_comment", {"post_id": post_id, "content": "x"}, meta=meta(token())
        )
    assert result.is_error
    assert expected in text_of(result)
    assert hub.state()["comments"] == []


def _forged_unsigned() -> str:
    claims = {"sub": "admin", "tid": TASK, "grants": ["hub:*"], "denied": [], "exp": 2**31}
    return jwt.encode(claims, key=None, algorithm="none")  # type: ignore[arg-type]


async def test_the_server_enforces_the_grants_in_the_capability(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    post_id = hub.seed_post("Help?")
    reader = capability(grants=("hub:read",))
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        write = await session.call_tool(
            "create_comment", {"post_id": post_id, "content": "x"}, meta=meta(reader)
        )
        read = await session.call_tool("get_thread", {"post_id": post_id}, meta=meta(reader))
        denied = capability(grants=("hub:*",))
        # hub:* with nothing denied covers writes ...
        allowed = await session.call_tool(
            "create_comment", {"post_id": post_id, "content": "ok"}, meta=meta(denied, step=2)
        )
    assert write.is_error
    assert "does not hold hub:write for create_comment" in text_of(write)
    assert not read.is_error
    assert not allowed.is_error
    assert [c["content"] for c in hub.state()["comments"]] == ["ok"]


async def test_an_idempotency_key_of_another_task_is_refused(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    post_id = hub.seed_post("Help?")
    values = dict(meta(capability()))
    values["idempotency_key"] = "other-task:tool:1:0"
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        result = await session.call_tool(
            "create_comment",
            {"post_id": post_id, "content": "x"},
            meta=cast(RequestParamsMeta, values),
        )
    assert result.is_error
    assert "did not say which" in text_of(result)
    assert hub.state()["comments"] == []


async def test_web_server_refuses_calls_without_a_web_read_capability() -> None:
    with running_mcp("web", auth_token=MCP_TOKEN, capability_key=CAPABILITY_KEY) as web:
        async with mcp_http_session(web.url, auth_token=MCP_TOKEN) as session:
            bare = await session.call_tool("fetch", {"url": "http://127.0.0.1:9/"}, meta=meta(None))
            hub_only = await session.call_tool(
                "fetch", {"url": "http://127.0.0.1:9/"}, meta=meta(capability())
            )
            granted = await session.call_tool(
                "fetch",
                {"url": "http://127.0.0.1:9/"},
                meta=meta(capability(grants=("web:read",))),
            )
    assert "no capability" in text_of(bare)
    assert "does not hold web:read for fetch" in text_of(hub_only)
    # Past the capability check, the SSRF policy answers (loopback is refused).
    assert "capability" not in text_of(granted)
    assert granted.is_error


def test_a_short_capability_key_stops_the_server_with_one_clear_line() -> None:
    environment = server_environment({"HUB_URL": "http://127.0.0.1:9", "CAPABILITY_KEY": "short"})
    finished = subprocess.run(
        [sys.executable, "-m", "mcp_servers.hub", "--port", "0"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert finished.stderr.strip().splitlines() == [
        "mcp_servers.hub: CAPABILITY_KEY must be at least 32 characters (got 5); "
        "generate one with: openssl rand -hex 32"
    ]


async def test_the_server_refuses_writes_outside_the_capabilitys_scope(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    # What a CLI through the gateway, a replayed call or a loop bug sends with the task's
    # capability: the notification's scope (reply on p, nothing else) bounds it here too.
    thread, unrelated = hub.seed_post("Help?"), hub.seed_post("Gardening")
    token = capability(scope=TaskScope(comment_on=frozenset({thread}), reply_to=thread))
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        post = await session.call_tool(
            "create_post",
            {"content": "PWNED", "community": "m/announcements"},
            meta=meta(token, step=1),
        )
        elsewhere = await session.call_tool(
            "create_comment", {"post_id": unrelated, "content": "PWNED"}, meta=meta(token, step=2)
        )
        reply = await session.call_tool(
            "create_comment", {"post_id": thread, "content": "the answer"}, meta=meta(token, step=3)
        )
        # Another call with its own key: still the task's one reply, made once.
        again = await session.call_tool(
            "create_comment",
            {"post_id": thread, "content": "PWNED again"},
            meta=meta(token, step=4),
        )

    assert post.is_error
    assert text_of(post) == "Error executing tool create_post: out of scope: this task may not post"
    assert elsewhere.is_error
    assert text_of(elsewhere) == (
        "Error executing tool create_comment: "
        f"out of scope: this task answers post {thread} and may comment only there; "
        "reply in that thread, or in your final answer"
    )
    assert not reply.is_error and not again.is_error
    state = hub.state()
    assert [(c["post_id"], c["content"]) for c in state["comments"]] == [(thread, "the answer")]
    assert [p["id"] for p in state["posts"]] == [thread, unrelated]
    assert "PWNED" not in mcp_hub.stderr_text()  # the log names the refusal, not the text


async def test_a_capability_signed_before_scopes_is_bounded_by_its_grants_alone(
    hub: DevHub, mcp_hub: RunningMcpServer
) -> None:
    claims = jwt.decode(capability(), CAPABILITY_KEY, algorithms=["HS256"], audience=AUDIENCE)
    del claims["scope"]
    unscoped = jwt.encode(claims, CAPABILITY_KEY, algorithm="HS256")
    async with mcp_http_session(mcp_hub.url, auth_token=MCP_TOKEN) as session:
        result = await session.call_tool(
            "create_post", {"content": "release notes", "community": "m/ops"}, meta=meta(unscoped)
        )
    assert not result.is_error, text_of(result)


async def test_the_web_server_bounds_a_private_tasks_fetch_and_its_redirects() -> None:
    """A call sent straight to mcp-web (a replay, a CLI) is bounded by the capability's reach:
    the person's link loads, a composed URL and a redirect to another host never leave."""
    with loopback_host() as page, loopback_host() as collector:
        base = page.url
        leak = f"{collector.url}/c?d=door-code"
        reach = Reach(private=True, urls=frozenset({f"{base}/page/p1"}), allow=(f"{base}/open/",))
        private = capability(grants=("web:read",), scope=replace(ANYWHERE, reach=reach))
        public = capability(grants=("web:read",))
        with running_mcp(
            "web", auth_token=MCP_TOKEN, capability_key=CAPABILITY_KEY, allow_networks="127.0.0.0/8"
        ) as web:
            async with mcp_http_session(web.url, auth_token=MCP_TOKEN) as session:

                async def fetch(url: str, token: str) -> str:
                    result = await session.call_tool("fetch", {"url": url}, meta=meta(token))
                    return text_of(result)

                own = await fetch(f"{base}/page/p1", private)
                composed = await fetch(leak, private)
                redirected = await fetch(f"{base}/open/redirect?to={quote(leak)}", private)
                reached_privately = list(collector.seen)
                as_before = await fetch(leak, public)

    assert "PAGE-OK-p1" in own
    assert "out of reach" in composed and "door-code" not in composed
    assert "out of reach" in redirected and redirected.endswith("(a redirect)")
    assert reached_privately == []
    assert "ok" in as_before and len(collector.seen) == 1
