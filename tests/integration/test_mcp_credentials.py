"""What each MCP server gets from the worker, and what the worker takes back from it.

Per-server credentials (a third-party server never sees MCP_AUTH_TOKEN or the
capability), the capability and deadline in first-party ``_meta``, results capped
while they stream (HTTP and stdio), and stdio stderr as JSON log events.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_servers import running_mcp
from tests.support.mcp_test_servers.launch import stdio_entry
from worker.exceptions import ToolFailed
from worker.tools._base import CallContext
from worker.tools._capability import mint_capability, verify_capability
from worker.tools._config import McpConfig, load_mcp_config
from worker.tools._grants import EffectiveGrants
from worker.tools._mcp import McpToolbox, fixed_capability
from worker.tools._scope import TaskScope

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WORKER_TOKEN = "worker-mcp-token-canary-41c7"
THIRD_PARTY_TOKEN = "third-party-token-canary-9d02"
CAPABILITY_KEY = "capability-key-canary-" + "k" * 32
GITHUB_TOKEN = "ghp-canary-stdio-credential-77"
GRANTS = EffectiveGrants.of(["kit:read", "rec:use"])


def context(timeout_s: float = 30.0, step: int = 1) -> CallContext:
    return CallContext(
        task_id="task-9", agent_id="agent-a", step=step, index=0, timeout_s=timeout_s
    )


def capability() -> str:
    return mint_capability(
        CAPABILITY_KEY,
        agent_id="agent-a",
        task_id="task-9",
        grants=GRANTS,
        expires_at=time.time() + 300,
        # Anywhere: these tests are about identity and grants, not the scope.
        scope=TaskScope(comment_on=None, post_in=None),
    )


def records(path: Path, kind: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [entry[kind] for entry in entries if entry["kind"] == kind]


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The recording 'third-party' server over HTTP, and the file it records to."""
    record_file = tmp_path / "recorded.jsonl"
    environment = {"RECORD_FILE": str(record_file)}
    with running_mcp("tests.support.mcp_test_servers.recorder", environment=environment) as server:
        yield server.url, record_file


@pytest.fixture
def http_kit_url() -> Iterator[str]:
    with running_mcp("tests.support.mcp_test_servers.toolkit") as server:
        yield server.url


async def test_third_party_http_server_gets_only_its_own_token_and_no_capability(
    recorder: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, record_file = recorder
    monkeypatch.setenv("REC_TOKEN", THIRD_PARTY_TOKEN)
    config_path = tmp_path / "mcp.yaml"
    config_path.write_text(
        f"servers:\n  rec: {{url: '{url}', token: '${{REC_TOKEN}}', tools: {{'*': rec:use}}}}\n"
    )
    token = capability()
    async with McpToolbox.open(
        load_mcp_config(config_path),
        grants=GRANTS,
        auth_token=WORKER_TOKEN,
        capability=fixed_capability(token),
    ) as toolbox:
        result = await toolbox.call("rec__note", {"text": "hi"}, context())
        assert result.content == "noted: hi"

    seen = record_file.read_text()
    assert WORKER_TOKEN not in seen
    assert token not in seen
    assert CAPABILITY_KEY not in seen
    headers = records(record_file, "headers")
    assert headers, "the recorder saw no request"
    assert {h.get("authorization") for h in headers} == {f"Bearer {THIRD_PARTY_TOKEN}"}
    (meta,) = records(record_file, "meta")
    assert "capability" not in meta
    assert meta["agent_id"] == "agent-a"
    assert meta["deadline"] > time.time()


async def test_third_party_server_without_credentials_gets_no_authorization(
    recorder: tuple[str, Path],
) -> None:
    url, record_file = recorder
    config = McpConfig.model_validate({"servers": {"rec": {"url": url, "tools": {"*": "rec:use"}}}})
    async with McpToolbox.open(
        config, grants=GRANTS, auth_token=WORKER_TOKEN, capability=fixed_capability(capability())
    ) as toolbox:
        await toolbox.call("rec__note", {"text": "hi"}, context())
    headers = records(record_file, "headers")
    assert headers
    assert all("authorization" not in h for h in headers)


async def test_first_party_server_gets_a_verifiable_capability_and_the_deadline() -> None:
    config = McpConfig.model_validate(
        {"servers": {"kit": stdio_entry("toolkit", {"*": "kit:read"}, first_party=True)}}
    )
    token = capability()
    async with McpToolbox.open(
        config, grants=GRANTS, capability=fixed_capability(token)
    ) as toolbox:
        before = time.time()
        echoed = await toolbox.call("kit__echo", {"text": "x"}, context(timeout_s=20))
    received = json.loads(echoed.content)
    # The toolkit echoes its _meta back: the worker scrubs the capability from the result.
    assert token not in echoed.content
    assert received["meta"]["capability"] == "[capability]"
    assert before < received["meta"]["deadline"] <= before + 21
    assert verify_capability(CAPABILITY_KEY, token).agent_id == "agent-a"


async def test_stdio_server_env_holds_only_what_its_entry_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCP_AUTH_TOKEN", WORKER_TOKEN)
    monkeypatch.setenv("CAPABILITY_KEY", CAPABILITY_KEY)
    monkeypatch.setenv("HUB_API_KEY", "hub-key-canary-0b3e")
    config = McpConfig.model_validate(
        {
            "servers": {
                "rec": stdio_entry("recorder", {"*": "rec:use"}, env={"GITHUB_TOKEN": GITHUB_TOKEN})
            }
        }
    )
    async with McpToolbox.open(config, grants=GRANTS, auth_token=WORKER_TOKEN) as toolbox:
        result = await toolbox.call("rec__environment", {}, context())
    environment = json.loads(result.content)
    assert environment["GITHUB_TOKEN"] == GITHUB_TOKEN
    for name in ("MCP_AUTH_TOKEN", "CAPABILITY_KEY", "HUB_API_KEY"):
        assert name not in environment
    for secret in (WORKER_TOKEN, CAPABILITY_KEY, "hub-key-canary-0b3e"):
        assert secret not in result.content


@pytest.mark.parametrize("shared", [False, True], ids=["own session", "shared session"])
async def test_a_server_refusing_the_token_is_withdrawn_saying_the_token_was_refused(
    log_stream: io.StringIO, shared: bool
) -> None:
    # The real mcp-hub, which wants another bearer token than the worker sends; with
    # ``shared`` through the process's session (a worker running tasks in threads).
    with running_mcp(
        "hub", hub_url="http://127.0.0.1:9", auth_token="the-servers-own-token-5c1a"
    ) as hub:
        config = McpConfig.model_validate(
            {"servers": {"hub": {"url": hub.url, "first_party": True, "tools": {"*": "hub:read"}}}}
        )
        grants = EffectiveGrants.of(["hub:read"])
        async with McpToolbox.open(
            config, grants=grants, auth_token=WORKER_TOKEN, share_sessions=shared
        ) as toolbox:
            reason = toolbox.unavailable_servers["hub"]

    assert reason == (
        "the server refused MCP_AUTH_TOKEN (HTTP 401): a wrong or missing token, not a server fault"
    )
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    (withdrawn,) = [event for event in events if event["event"] == "mcp_server_withdrawn"]
    assert withdrawn["reason"] == reason and WORKER_TOKEN not in log_stream.getvalue()


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_oversized_result_is_an_error_naming_the_tool_and_the_server_stays(
    transport: str, http_kit_url: str
) -> None:
    entry = (
        {"url": http_kit_url, "tools": {"*": "kit:read"}}
        if transport == "http"
        else stdio_entry("toolkit", {"*": "kit:read"})
    )
    config = McpConfig.model_validate({"servers": {"kit": entry}})
    async with McpToolbox.open(config, grants=GRANTS, max_result_bytes=200_000) as toolbox:
        with pytest.raises(ToolFailed) as failed:
            await toolbox.call("kit__huge", {"megabytes": 8}, context())
        assert str(failed.value) == (
            "tool kit__huge failed: result larger than 200000 bytes "
            "(MCP_RESULT_MAX_BYTES); it was not read"
        )
        # The connection survived the refused answer.
        assert (await toolbox.call("kit__add", {"a": 2, "b": 2}, context())).content == "4"
        assert toolbox.unavailable_servers == {}


async def test_stdio_stderr_becomes_redacted_rate_limited_json_events(
    log_stream: io.StringIO,
) -> None:
    config = McpConfig.model_validate(
        {
            "servers": {
                "rec": stdio_entry("recorder", {"*": "rec:use"}, env={"GITHUB_TOKEN": GITHUB_TOKEN})
            }
        }
    )
    async with McpToolbox.open(config, grants=GRANTS) as toolbox:
        await toolbox.call(
            "rec__stderr", {"text": f"token is {GITHUB_TOKEN} " + "y" * 5000}, context()
        )
        await toolbox.call("rec__stderr", {"text": "flood", "lines": 500}, context())
        await toolbox.call("rec__note", {"text": "after"}, context())
    lines = log_stream.getvalue().splitlines()
    assert all(line.startswith("{") for line in lines), "raw stderr reached the log"
    events = [json.loads(line) for line in lines]
    stderr_events = [e for e in events if e["event"] == "mcp_server_stderr"]
    assert all(e["server"] == "rec" for e in stderr_events)
    (leaky,) = [e for e in stderr_events if e["line"].startswith("token is")]
    assert GITHUB_TOKEN not in leaky["line"]
    assert "[redacted]" in leaky["line"]
    assert leaky["line"].endswith("[cut]")
    floods = [e for e in stderr_events if e["line"] == "flood"]
    assert 0 < len(floods) < 500
    assert GITHUB_TOKEN not in log_stream.getvalue()
