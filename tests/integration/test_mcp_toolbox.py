"""McpToolbox against real MCP servers: the toolkit over stdio and HTTP, and mcp-server-time."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.mcp_servers import running_mcp
from tests.support.mcp_test_servers.launch import stdio_entry
from tests.support.redis_server import free_port
from worker.exceptions import ToolFailed, ToolServerDown
from worker.tools._base import CallContext, Granted, MissingGrant, NotAllowed
from worker.tools._config import McpConfig, load_mcp_config
from worker.tools._grants import EffectiveGrants, GrantPolicy
from worker.tools._mcp import McpToolbox

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOKEN = "test-mcp-token-5f1c"
KIT_TOOLS = {"*": "kit:read", "crash": "kit:admin", "slow": "kit:read"}
TIME_BINARY = Path(sys.executable).parent / "mcp-server-time"


def context(timeout_s: float = 30.0, step: int = 1) -> CallContext:
    return CallContext(
        task_id="task-7", agent_id="agent-a", step=step, index=0, timeout_s=timeout_s
    )


def offered_names(toolbox: McpToolbox) -> set[str]:
    return {spec.name for spec in toolbox.offered()}


def assert_all_gone(pids: list[int]) -> None:
    assert pids, "no stdio server was started"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def kit_config(**more_servers: dict[str, Any]) -> McpConfig:
    return McpConfig.model_validate(
        {"servers": {"kit": stdio_entry("toolkit", KIT_TOOLS), **more_servers}}
    )


@pytest.fixture
def http_kit_url() -> Iterator[str]:
    """The toolkit over HTTP, refusing requests without ``Authorization: Bearer TOKEN``."""
    with running_mcp("tests.support.mcp_test_servers.toolkit", auth_token=TOKEN) as server:
        yield server.url


async def test_offers_granted_tools_and_passes_caller_meta_over_stdio() -> None:
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read"])
    async with McpToolbox.open(kit_config(), grants=grants, on_spawn=pids.append) as toolbox:
        names = offered_names(toolbox)
        assert {"kit__echo", "kit__add", "kit__slow", "kit__media"} <= names
        assert "kit__crash" not in names  # needs kit:admin
        # Listed by the server, but no provider accepts the name.
        assert "kit__dotted.name" not in names
        assert toolbox.resolve("kit__dotted.name") is None
        resolution = toolbox.resolve("kit__add")
        assert isinstance(resolution, Granted)
        assert resolution.server == "kit"
        assert resolution.spec.input_schema["required"] == ["a", "b"]
        assert "Add two integers" in resolution.spec.description

        added = await toolbox.call("kit__add", {"a": 2, "b": 3}, context())
        assert added.content == "5"
        assert not added.is_error

        echoed = await toolbox.call("kit__echo", {"text": "hello"}, context(step=4))
        received = json.loads(echoed.content)
        assert received["text"] == "hello"
        assert received["meta"]["agent_id"] == "agent-a"
        assert received["meta"]["task_id"] == "task-7"
        assert received["meta"]["idempotency_key"] == "task-7:tool:4:0"
        assert toolbox.unavailable_servers == {}
    assert len(pids) == 1
    assert_all_gone(pids)


async def test_http_server_gets_bearer_token_and_meta(http_kit_url: str) -> None:
    config = McpConfig.model_validate(
        {
            "servers": {
                "remote": {"url": http_kit_url, "first_party": True, "tools": {"*": "kit:read"}}
            }
        }
    )
    grants = EffectiveGrants.of(["kit:read"])
    async with McpToolbox.open(config, grants=grants, auth_token=TOKEN) as toolbox:
        assert "remote__echo" in offered_names(toolbox)
        echoed = await toolbox.call("remote__echo", {"text": "over http"}, context())
        assert json.loads(echoed.content)["meta"]["task_id"] == "task-7"

    # Without the token the server answers 401: withdrawn from the start, the task goes on.
    async with McpToolbox.open(config, grants=grants) as toolbox:
        assert toolbox.offered() == []
        assert "remote" in toolbox.unavailable_servers
        assert toolbox.resolve("remote__echo") is None


async def test_configured_header_wins_over_the_worker_token(
    http_kit_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_KIT_AUTHORIZATION", f"Bearer {TOKEN}")
    config_path = tmp_path / "mcp.yaml"
    config_path.write_text(
        "servers:\n"
        f"  remote: {{url: '{http_kit_url}',\n"
        "           headers: {Authorization: '${TEST_KIT_AUTHORIZATION}'},\n"
        "           tools: {add: kit:read}}\n"
    )
    config = load_mcp_config(config_path)
    grants = EffectiveGrants.of(["kit:*"])
    async with McpToolbox.open(config, grants=grants, auth_token="wrong-token") as toolbox:
        assert offered_names(toolbox) == {"remote__add"}
        assert (await toolbox.call("remote__add", {"a": 1, "b": 1}, context())).content == "2"


async def test_third_party_time_server_configured_only_by_yaml(tmp_path: Path) -> None:
    config_path = tmp_path / "mcp.yaml"
    config_path.write_text(
        f'servers:\n  time: {{command: "{TIME_BINARY}", tools: {{"*": time:read}}}}\n'
    )
    config = load_mcp_config(config_path)
    pids: list[int] = []
    grants = EffectiveGrants.of(["time:read"])
    async with McpToolbox.open(config, grants=grants, on_spawn=pids.append) as toolbox:
        assert "time__get_current_time" in offered_names(toolbox)
        result = await toolbox.call("time__get_current_time", {"timezone": "UTC"}, context())
        assert not result.is_error
        assert json.loads(result.content)["timezone"] == "UTC"
    assert_all_gone(pids)


async def test_grant_matrix_unknown_ungranted_and_narrowed_tools() -> None:
    config = kit_config(time={"command": str(TIME_BINARY), "tools": {"*": "time:read"}})
    policy = GrantPolicy.model_validate(
        {
            "default": {"allowed_grants": ["kit:*"], "denied_grants": ["kit:admin"]},
            "agents": {"ops": {"denied_grants": []}},
        }
    )
    requested = ["kit:*", "time:read"]
    pids: list[int] = []
    grants = policy.effective_grants("writer", requested)
    async with McpToolbox.open(config, grants=grants, on_spawn=pids.append) as toolbox:
        # The policy allows only kit:*, so the time server is not even started.
        assert len(pids) == 1
        assert toolbox.resolve("time__get_current_time") == MissingGrant(
            name="time__get_current_time", required_grant="time:read"
        )
        # Denied beats the requested and allowed wildcard.
        assert toolbox.resolve("kit__crash") == MissingGrant(
            name="kit__crash", required_grant="kit:admin"
        )
        assert "kit__crash" not in offered_names(toolbox)
        assert isinstance(toolbox.resolve("kit__echo"), Granted)
        # Unknown: not listed by the server, unknown server, no separator.
        assert toolbox.resolve("kit__no_such_tool") is None
        assert toolbox.resolve("nowhere__echo") is None
        assert toolbox.resolve("echo") is None

    # The agent entry overrides the default's denied list: ops may crash the server.
    grants = policy.effective_grants("ops", requested)
    async with McpToolbox.open(config, grants=grants) as toolbox:
        assert isinstance(toolbox.resolve("kit__crash"), Granted)

    # The task narrows the offer: a tool outside allowed_tools is not there at all.
    grants = EffectiveGrants.of(requested)
    async with McpToolbox.open(
        config, grants=grants, allowed_tools=["kit__add", "kit__crash"]
    ) as toolbox:
        assert offered_names(toolbox) == {"kit__add", "kit__crash"}
        assert toolbox.resolve("kit__echo") == NotAllowed(name="kit__echo")
        assert toolbox.resolve("time__get_current_time") == NotAllowed(
            name="time__get_current_time"
        )

    # The agent's mcp_servers leave the kit server out entirely.
    async with McpToolbox.open(config, grants=grants, servers=["time"]) as toolbox:
        assert {name.split("__")[0] for name in offered_names(toolbox)} == {"time"}
        assert toolbox.resolve("kit__echo") is None
    assert_all_gone(pids)


async def test_tool_error_result_and_content_conversion() -> None:
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read"])
    async with McpToolbox.open(kit_config(), grants=grants, on_spawn=pids.append) as toolbox:
        failed = await toolbox.call("kit__fail", {"reason": "quota exhausted"}, context())
        assert failed.is_error
        assert failed.content == "Error executing tool fail: quota exhausted"

        media = await toolbox.call("kit__media", {}, context())
        assert media.content.splitlines() == [
            "[image: image/png, 1024 bytes]",
            "[audio: audio/wav, 2048 bytes]",
            "[resource: file:///notes.txt]",
            "hi",
        ]
        structured = await toolbox.call("kit__structured_only", {}, context())
        assert structured.content == '{"answer":42,"unit":"items"}'

        # Under the result cap (see test_mcp_credentials for over it).
        huge = await toolbox.call("kit__huge", {"megabytes": 1}, context())
        assert len(huge.content) == 1024 * 1024
        # The connection is still fine after the big line.
        assert (await toolbox.call("kit__add", {"a": 1, "b": 2}, context())).content == "3"
    assert_all_gone(pids)


async def test_stdio_server_dying_mid_task_is_withdrawn_and_the_other_goes_on() -> None:
    config = kit_config(spare=stdio_entry("toolkit", {"add": "spare:read"}))
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:*", "spare:read"])
    async with McpToolbox.open(config, grants=grants, on_spawn=pids.append) as toolbox:
        assert "kit__echo" in offered_names(toolbox)
        with pytest.raises(ToolServerDown) as down:
            await toolbox.call("kit__crash", {}, context())
        assert (
            str(down.value) == "server 'kit' is unavailable; its tools were withdrawn for this task"
        )
        assert offered_names(toolbox) == {"spare__add"}
        assert "kit" in toolbox.unavailable_servers
        # The model was told once; afterwards the tools are simply gone.
        assert toolbox.resolve("kit__echo") is None
        assert (await toolbox.call("spare__add", {"a": 20, "b": 22}, context())).content == "42"
    assert len(pids) == 2
    assert_all_gone(pids)


async def test_server_killed_while_idle_is_withdrawn_and_the_model_told_once() -> None:
    config = kit_config(spare=stdio_entry("toolkit", {"add": "spare:read"}))
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read", "spare:read"])
    async with McpToolbox.open(config, grants=grants, on_spawn=pids.append) as toolbox:
        kit_pid = int((await toolbox.call("kit__pid", {}, context())).content)
        assert kit_pid in pids
        os.kill(kit_pid, signal.SIGKILL)
        with anyio.fail_after(20):
            # The toolbox notices the exit on its own; it exposes no event to wait on.
            while "kit" not in toolbox.unavailable_servers:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert offered_names(toolbox) == {"spare__add"}
        # Not told yet: the next call explains why the tool is gone ...
        assert isinstance(toolbox.resolve("kit__add"), Granted)
        with pytest.raises(ToolServerDown, match="server 'kit' is unavailable"):
            await toolbox.call("kit__add", {"a": 1, "b": 1}, context())
        # ... and from then on the tool is simply not there.
        assert toolbox.resolve("kit__add") is None
    assert_all_gone(pids)


async def test_http_server_dying_mid_task_does_not_cancel_the_caller(http_kit_url: str) -> None:
    config = kit_config(
        remote={"url": http_kit_url, "first_party": True, "tools": {"*": "kit:admin"}}
    )
    grants = EffectiveGrants.of(["kit:*"])
    async with McpToolbox.open(config, grants=grants, auth_token=TOKEN) as toolbox:
        with pytest.raises(ToolServerDown, match="server 'remote' is unavailable"):
            await toolbox.call("remote__crash", {}, context())
        assert not any(name.startswith("remote__") for name in offered_names(toolbox))
        assert toolbox.resolve("remote__add") is None
        assert (await toolbox.call("kit__add", {"a": 1, "b": 1}, context())).content == "2"


async def test_servers_that_never_start_are_withdrawn_and_the_rest_works() -> None:
    nothing_listening = f"http://127.0.0.1:{free_port()}/mcp"
    config = kit_config(
        exits={
            "command": sys.executable,
            "args": ["-c", "raise SystemExit(1)"],
            "tools": {"*": "kit:read"},
        },
        absent={"command": "/nonexistent/mcp-server", "tools": {"*": "kit:read"}},
        refused={"url": nothing_listening, "tools": {"*": "kit:read"}},
    )
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read"])
    async with McpToolbox.open(config, grants=grants, on_spawn=pids.append) as toolbox:
        assert set(toolbox.unavailable_servers) == {"exits", "absent", "refused"}
        assert "FileNotFoundError" in toolbox.unavailable_servers["absent"]
        assert {name.split("__")[0] for name in offered_names(toolbox)} == {"kit"}
        assert toolbox.resolve("exits__anything") is None
        assert (await toolbox.call("kit__add", {"a": 2, "b": 2}, context())).content == "4"
    assert len(pids) == 2
    assert_all_gone(pids)


async def test_server_that_never_answers_is_withdrawn_after_the_connect_timeout() -> None:
    mute = {
        "command": sys.executable,
        "args": ["-c", "import time; time.sleep(600)"],
        "tools": {"*": "kit:read"},
    }
    config = McpConfig.model_validate({"servers": {"mute": mute}})
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read"])
    async with McpToolbox.open(
        config, grants=grants, connect_timeout_s=1.0, on_spawn=pids.append
    ) as toolbox:
        assert toolbox.unavailable_servers == {"mute": "did not connect within 1 s"}
        assert toolbox.offered() == []
    assert len(pids) == 1
    assert_all_gone(pids)


async def test_hanging_tool_times_out_and_the_toolbox_still_closes() -> None:
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read"])
    async with McpToolbox.open(kit_config(), grants=grants, on_spawn=pids.append) as toolbox:
        with pytest.raises(ToolFailed, match=r"^tool kit__slow timed out after 0\.5 s$"):
            await toolbox.call("kit__slow", {"seconds": 600}, context(timeout_s=0.5))
        assert (await toolbox.call("kit__add", {"a": 1, "b": 1}, context())).content == "2"
    assert_all_gone(pids)


async def test_no_stdio_child_survives_cancellation_or_an_exception() -> None:
    pids: list[int] = []
    grants = EffectiveGrants.of(["kit:read"])
    connected = anyio.Event()

    async def run_task() -> None:
        async with McpToolbox.open(kit_config(), grants=grants, on_spawn=pids.append) as toolbox:
            connected.set()
            await toolbox.call("kit__slow", {"seconds": 600}, context(timeout_s=600))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(run_task)
        await connected.wait()
        await anyio.sleep(0.5)  # let the call reach the server
        task_group.cancel_scope.cancel()
    assert_all_gone(pids)

    pids.clear()
    with pytest.raises(LookupError, match="the loop failed"):
        async with McpToolbox.open(kit_config(), grants=grants, on_spawn=pids.append):
            raise LookupError("the loop failed")
    assert_all_gone(pids)
