"""The CLI sandbox in the default suite: real bwrap, real gateway, real model endpoint.

The CLI is a stand-in installed as ``claude`` and run on the system Python (the sandbox
sees nothing of the worker's interpreter): it does what a prompt-injected Claude Code
would with a shell. It runs the probe (``tests/support/sandbox_probes.py``), reports its
own resource limits, calls a granted tool through the MCP server its configuration names
(the bridge to the worker's gateway), and sends all of it to the model endpoint as the
real CLI sends tool results. Skipped, with the reason, only when bwrap is not installed.
The real CLIs do the same in ``test_cli_sandbox_real.py`` (opt-in).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.support.mcp_test_servers.launch import stdio_entry
from tests.support.redis_server import RedisServer
from tests.support.sandbox_probes import _PROBE, assert_sandbox_bounds, find_probe_report
from tests.support.workers import REPO_ROOT
from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig
from worker.dev.scripted_endpoint import ScriptedEndpoint
from worker.executors import ExecutionRequest
from worker.executors._claude import ClaudeCodeExecutor
from worker.loop import LoopSettings, RunLimits
from worker.models import Message
from worker.settings import Settings
from worker.task import Outcome, Task
from worker.tools import EffectiveGrants

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.timeout(180),
]

MCP_TOKEN = "mcp-token-sandbox-" + secrets.token_hex(8)
HUB_KEY = "hub-key-sandbox-" + secrets.token_hex(8)
ANTHROPIC_KEY_PREFIX = "sk-ant-sandbox-"
ANTHROPIC_KEY = ANTHROPIC_KEY_PREFIX + secrets.token_hex(8)
ENV_CANARY = "canary-env-" + secrets.token_hex(8)
BESIDE_CLI_CANARY = "ssh-key-canary-" + secrets.token_hex(8)
ARGV_CANARY = "argv-canary-" + secrets.token_hex(8)
# What a tool server started by npm leaves under its HOME: a debug log with its argv.
_HOME_WRITER = """
import os, pathlib, runpy, sys
home = pathlib.Path(os.environ["HOME"])
(home / ".npm" / "_logs").mkdir(parents=True, exist_ok=True)
(home / ".npm" / "_logs" / "debug-0.log").write_text("argv: " + sys.argv[1])
pathlib.Path(sys.argv[2]).write_text(str(home))
sys.argv = [sys.argv[0], "--stdio"]
runpy.run_module("tests.support.mcp_test_servers.toolkit", run_name="__main__")
"""

# The stand-in: what Claude Code does with --mcp-config and a shell, in plain Python.
_CLI = r"""
import json, os, subprocess, sys, time, urllib.request

def option(name):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None

sys.stdin.read()
scenario = json.loads(__SCENARIO__)
if scenario.get("sleep_s"):
    subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(600)", scenario["marker"]])
    time.sleep(scenario["sleep_s"])
TARGETS = json.dumps(scenario["targets"])
__PROBE_SOURCE__
report["limits"] = open("/proc/self/limits").read()
report["hostname"] = open("/proc/sys/kernel/hostname").read().strip()

gateway = json.load(open(option("--mcp-config")))["mcpServers"]["gateway"]
bridge = subprocess.Popen(
    [gateway["command"], *gateway["args"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    env=gateway["env"],
)
def rpc(message):
    bridge.stdin.write((json.dumps(message) + "\n").encode())
    bridge.stdin.flush()
    if "id" in message:
        return json.loads(bridge.stdout.readline())
rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "stand-in", "version": "1"}}})
rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
tools = rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})["result"]["tools"]
echoed = rpc({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
              "params": {"name": "kit__echo", "arguments": {"text": "ping"}}})["result"]
bridge.stdin.close()
report["tools"] = sorted(tool["name"] for tool in tools)
report["echo"] = echoed

encoded = __import__("base64").b64encode(zlib.compress(json.dumps(report).encode())).decode()
result = {"type": "tool_result", "tool_use_id": "t1", "content": "SANDBOX-PROBE " + encoded}
body = json.dumps({"model": option("--model"), "max_tokens": 100,
                   "messages": [{"role": "user", "content": [result]}]})
request = urllib.request.Request(
    os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=body.encode(),
    headers={"content-type": "application/json", "x-api-key": os.environ["ANTHROPIC_API_KEY"],
             "anthropic-version": "2023-06-01"})
answer = json.load(urllib.request.urlopen(request, timeout=30))
text = "".join(block.get("text", "") for block in answer["content"])
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": text,
                  "num_turns": 1, "usage": answer["usage"], "total_cost_usd": 0.001}))
"""


@pytest.fixture
def stand_in() -> Iterator[Path]:
    """``claude`` on the system Python, in a directory bwrap (as the sandbox's user) can
    read, next to a file of the kind a work directory holds (an SSH key)."""
    directory = Path(tempfile.mkdtemp(prefix="stand-in-cli-"))
    directory.chmod(0o755)
    (directory / "id_ed25519").write_text(BESIDE_CLI_CANARY)
    (directory / "id_ed25519").chmod(0o644)
    cli = directory / "claude"
    write_stand_in(cli, {"targets": {}})
    yield cli
    shutil.rmtree(directory, ignore_errors=True)


def write_stand_in(cli: Path, scenario: dict[str, Any]) -> None:
    """The stand-in with its scenario inside: the sandbox mounts the CLI's file, not its
    directory."""
    source = _CLI.replace("__PROBE_SOURCE__", textwrap.dedent(_PROBE))
    cli.write_text(
        "#!/usr/bin/python3\n" + source.replace("__SCENARIO__", repr(json.dumps(scenario)))
    )
    cli.chmod(0o755)


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret in the worker's own environment, for the probe's /proc/*/environ."""
    monkeypatch.setenv("SANDBOX_TEST_CANARY", ENV_CANARY)


def make_request(
    stand_in: Path,
    mcp_config: Path,
    base_url: str,
    scenario: dict[str, Any],
    *,
    max_duration_s: float = 90,
) -> ExecutionRequest:
    """The task, and the stand-in playing ``scenario``."""
    write_stand_in(stand_in, scenario)
    agent = AgentDefinition(
        config=AgentConfig.model_validate(
            {
                "name": "sandboxed-agent",
                "type": "claude-code",
                "brain": {"provider": "anthropic", "model": "claude-sonnet-4-5"},
                "capabilities": {"grants": ["kit:read"], "shell": {"enabled": True}},
            }
        ),
        system_prompt="You are terse.",
    )
    settings = Settings(
        anthropic_api_key=ANTHROPIC_KEY,  # type: ignore[arg-type]
        anthropic_base_url=base_url,
        mcp_auth_token=MCP_TOKEN,  # type: ignore[arg-type]
        hub_api_key=HUB_KEY,  # type: ignore[arg-type]
        mcp_config=mcp_config,
        cli_sandbox_max_processes=64,
        cli_sandbox_max_file_mb=8,
        cli_sandbox_workspace_mb=16,
        cli_sandbox_tmp_mb=16,
    )
    return ExecutionRequest(
        task=Task.model_validate(
            {"task_id": "t-sandbox-1", "type": "exploration", "agent_id": "sandboxed-agent"}
        ),
        agent=agent,
        system="You are terse.",
        messages=[Message(role="user", content="Collect diagnostics.")],
        settings=LoopSettings(limits=RunLimits(max_iterations=3, max_duration_s=max_duration_s)),
        worker_settings=settings,
        grants=EffectiveGrants.of(agent.config.capabilities.grants),
        open_toolbox=lambda: None,  # type: ignore[arg-type,return-value]
        make_model=lambda: None,  # type: ignore[arg-type,return-value]
    )


@pytest.fixture
def mcp_config(tmp_path: Path) -> Path:
    """The toolkit server, started as npm would start it: writing under its HOME first
    (where it wrote is recorded in ``server-home.txt`` next to the config)."""
    path = tmp_path / "mcp.yaml"
    kit = stdio_entry("toolkit", {"echo": "kit:read"})
    kit["args"] = ["-c", _HOME_WRITER, ARGV_CANARY, str(tmp_path / "server-home.txt")]
    path.write_text(yaml.safe_dump({"servers": {"kit": kit}}))
    return path


async def test_a_shell_in_the_sandbox_reaches_only_its_workspace_gateway_and_model(
    stand_in: Path,
    mcp_config: Path,
    worker_env: None,
    redis_server: RedisServer,
    capfd: pytest.CaptureFixture[str],
) -> None:
    escape = f"escape-{secrets.token_hex(6)}"
    targets = {
        "repo": str(REPO_ROOT),
        "mcp_config": str(mcp_config),
        "redis": redis_server.port,
        "hub": redis_server.port,
        "escape": escape,
        "beside_cli": str(stand_in.parent / "id_ed25519"),
        "key_prefix_reversed": ANTHROPIC_KEY_PREFIX[::-1],
        "fill_mb": 32,
    }
    with ScriptedEndpoint() as endpoint:
        endpoint.set_scenario("default", [{"text": "diagnostics sent"}])
        request = make_request(
            stand_in, mcp_config, endpoint.anthropic_base_url, {"targets": targets}
        )
        result = await ClaudeCodeExecutor(executable=str(stand_in)).run(request)
        requests = endpoint.requests()

    assert result.outcome is Outcome.COMPLETED, result.error
    assert result.output == "diagnostics sent"  # the model endpoint, through the relay
    # The worker's log and the gateway's (its stderr joins the worker's): one line per call.
    logged = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line[:1] == "{"]
    [call] = [event for event in logged if event["event"] == "tool_call"]
    assert call["tool"] == "kit__echo" and call["executor"] == "claude-code"
    [probe] = [find_probe_report(json.dumps(r["body"])) for r in requests]
    assert probe is not None
    # The granted tool works through the bridge; nothing else of the host does.
    assert probe["tools"] == ["kit__echo"]
    assert probe["echo"]["isError"] is False and "ping" in json.dumps(probe["echo"])
    assert probe["private_files"] == []
    assert probe["uid"] == 65534 if os.geteuid() == 0 else probe["uid"] != 0
    assert probe["hostname"] == "agent-sandbox"
    assert not [line for line in probe["processes"] if "redis" in line or "pytest" in line]
    for attempt in ("repo", "mcp_config", "redis", "write_repo", "write_private"):
        assert probe[attempt].startswith("BLOCKED"), (attempt, probe[attempt])
    assert probe["write_tmp"].startswith("READ")  # its own /tmp, gone with it
    for escaped in (REPO_ROOT / escape, Path("/tmp") / escape):
        assert not await anyio.Path(escaped).exists()
    # Its /tmp: the run's directories, its own install and what it wrote; nothing of others.
    [run_dir] = [path for path in probe["tmp_files"] if path.count("/") == 2 and "agent-" in path]
    seen = [path for path in probe["tmp_files"] if not path.startswith(str(stand_in.parent))]
    assert all(path in {"/tmp/", f"/tmp/{escape}"} or path.startswith(run_dir) for path in seen)
    # Limits from the settings and the task's duration.
    limits = {line[:26].strip(): line[26:].split() for line in probe["limits"].splitlines()[1:]}
    assert limits["Max processes"][0] == "64"
    assert limits["Max file size"][0] == str(8 * 1024 * 1024)
    assert limits["Max data size"][0] == str(4096 * 1024 * 1024)
    assert 1 <= int(limits["Max cpu time"][0]) <= 90
    # No secret of the worker reached the model.
    seen = json.dumps(requests)
    for secret in (MCP_TOKEN, HUB_KEY, ENV_CANARY, redis_server.url, "[project]"):
        assert secret not in seen
    assert_the_second_pass_holds(probe, requests, stand_in, mcp_config)


def assert_the_second_pass_holds(
    probe: dict[str, Any], requests: list[dict[str, Any]], stand_in: Path, mcp_config: Path
) -> None:
    """The leaks of the sandbox's second pass, each closed (``assert_sandbox_bounds``), and
    what only the host sees: where the servers' HOME was, the key the relay added."""
    assert_sandbox_bounds(probe, beside_cli=str(stand_in.parent / "id_ed25519"))
    seen = json.dumps(requests) + json.dumps(probe)
    server_home = (mcp_config.parent / "server-home.txt").read_text()
    assert server_home.endswith("/gateway-home"), server_home
    for canary in (ARGV_CANARY, BESIDE_CLI_CANARY, ANTHROPIC_KEY):
        assert canary not in seen
    # The endpoint got a key of the real one's length: the relay's, not the placeholder.
    assert [r["auth_headers"] for r in requests] == [{"x-api-key": len(ANTHROPIC_KEY)}]
    for filled in probe["fill"].values():
        assert int(filled.split()[3]) <= 16  # MiB: CLI_SANDBOX_TMP_MB, _WORKSPACE_MB


async def test_the_deadline_kills_everything_in_the_sandbox(
    stand_in: Path, mcp_config: Path
) -> None:
    marker = f"sleeper-{secrets.token_hex(6)}"
    with ScriptedEndpoint() as endpoint:
        request = make_request(
            stand_in,
            mcp_config,
            endpoint.anthropic_base_url,
            {"targets": {}, "sleep_s": 300, "marker": marker},
            max_duration_s=8,
        )
        result = await ClaudeCodeExecutor(executable=str(stand_in)).run(request)

    assert result.outcome is Outcome.DEADLINE
    assert not [command for command in _host_processes() if marker in command]


def _host_processes() -> list[str]:
    """The command line of every process on the host."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes().decode("utf-8", "replace"))
            except OSError:
                continue
    return found


async def test_without_bwrap_a_cli_task_fails_naming_it(
    stand_in: Path, mcp_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(stand_in.parent))
    request = make_request(stand_in, mcp_config, "http://127.0.0.1:9", {"targets": {}})
    result = await ClaudeCodeExecutor(executable=str(stand_in)).run(request)

    assert result.outcome is Outcome.ERROR
    assert "`bwrap` (bubblewrap) is not installed" in str(result.error)
    assert not result.steps  # the CLI never started


async def test_a_gateway_that_cannot_start_stops_the_cli_with_a_clear_error(
    stand_in: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "mcp.yaml"
    broken.write_text("servers: [unclosed\n")
    with ScriptedEndpoint() as endpoint:
        targets = {"repo": "/none", "mcp_config": "/none", "redis": 1, "hub": 1, "escape": "x"}
        request = make_request(stand_in, broken, endpoint.anthropic_base_url, {"targets": targets})
        result = await ClaudeCodeExecutor(executable=str(stand_in)).run(request)
        requests = endpoint.requests()

    assert result.outcome is Outcome.ERROR
    assert "the task's gateway exited while it ran" in str(result.error)
    assert requests == []  # the CLI never got past its MCP connection
