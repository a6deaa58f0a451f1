"""``agent-worker check`` and the operator commands against real Redis, devhub and MCP server:
good and broken setups, exit codes, ``--redis-url``, and no secret in any output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support.definitions import SHIPPED_DEMO_AGENTS
from tests.support.devhub import DevHub, running_devhub
from tests.support.mcp_servers import RunningMcpServer, running_mcp
from tests.support.scripted_llm import ScriptedLlm, running_scripted_llm
from worker.dev.devstack import free_port
from worker.enqueue import enqueue_task

pytestmark = pytest.mark.integration

AGENT_WORKER = str(Path(sys.executable).parent / "agent-worker")
HUB_KEY = "hub-key-check-0123456789abcdef"
MCP_TOKEN = "mcp-token-check-0123456789abcdef"
MODEL_KEY = "sk-check-5e0d2b7a9c4f1836"
SECRETS = (HUB_KEY, MCP_TOKEN, MODEL_KEY, "wrong-hub-key-zzzz", "wrong-mcp-token-zzzz")


@dataclass
class Stack:
    hub: DevHub
    mcp: RunningMcpServer
    llm: ScriptedLlm

    @property
    def model_env(self) -> dict[str, str]:
        """The demo agent's model (openai) at the scripted endpoint, with a key."""
        return {"OPENAI_BASE_URL": self.llm.openai_base_url, "OPENAI_API_KEY": MODEL_KEY}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with (
        running_devhub(api_key=HUB_KEY) as hub,
        running_mcp("hub", hub_url=hub.url, hub_api_key=HUB_KEY, auth_token=MCP_TOKEN) as mcp,
        running_scripted_llm() as llm,
    ):
        yield Stack(hub=hub, mcp=mcp, llm=llm)


def setup(tmp_path: Path, mcp_url: str, *, extra_servers: str = "") -> dict[str, str]:
    agents = tmp_path / "definitions"
    shutil.copytree(SHIPPED_DEMO_AGENTS, agents)
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text(
        "servers:\n"
        f"  hub: {{url: {mcp_url}, first_party: true,\n"
        "        tools: {search_posts: hub:read, create_post: hub:write}}\n" + extra_servers
    )
    return {"AGENTS_DIR": str(agents), "MCP_CONFIG": str(mcp)}


def agent_worker(
    args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [AGENT_WORKER, *args],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "METRICS_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    for secret in SECRETS:
        assert secret not in completed.stdout + completed.stderr
    return completed


def test_check_passes_on_a_good_setup(stack: Stack, redis_url: str, tmp_path: Path) -> None:
    env = {
        **setup(tmp_path, stack.mcp.url),
        **stack.model_env,
        "REDIS_URL": redis_url,
        "HUB_URL": stack.hub.url,
        "HUB_API_KEY": HUB_KEY,
        "MCP_AUTH_TOKEN": MCP_TOKEN,
    }
    completed = agent_worker(["check"], env, tmp_path)
    assert completed.returncode == 0, completed.stdout
    assert completed.stdout.splitlines() == [
        "check: 0 errors, 0 warnings; Redis answers; 1 of 1 agent definitions load; "
        "1 skills parse; 1 MCP servers configured; the Hub answers"
    ]


def test_check_names_every_problem_of_a_broken_setup(stack: Stack, tmp_path: Path) -> None:
    closed = free_port()
    env = {
        **setup(
            tmp_path,
            stack.mcp.url,
            extra_servers=(
                f"  gone: {{url: 'http://127.0.0.1:{closed}/mcp?token=zzzz', tools: {{a: g:r}}}}\n"
                '  time: {command: mcp-server-tme, tools: {"*": time:read}}\n'
            ),
        ),
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "HUB_URL": stack.hub.url,
        "HUB_API_KEY": "wrong-hub-key-zzzz",
        "MCP_AUTH_TOKEN": "wrong-mcp-token-zzzz",
    }
    config = Path(env["MCP_CONFIG"])
    completed = agent_worker(["check", "--timeout", "2"], env, tmp_path)
    assert completed.returncode == 1
    redis_port = env["REDIS_URL"].split(":")[2].split("/")[0]
    assert completed.stdout.splitlines()[:-1] == [
        f"error: REDIS_URL: Redis at redis://127.0.0.1:{redis_port}/0 does not answer "
        "(ConnectionError)",
        f"warning: MCP_CONFIG ({config}): servers.hub.url: {stack.mcp.url} refuses "
        "MCP_AUTH_TOKEN (HTTP 401)",
        f"warning: MCP_CONFIG ({config}): servers.gone.url: http://127.0.0.1:{closed}/mcp "
        "does not answer (ConnectError)",
        f"error: MCP_CONFIG ({config}): servers.time.command: 'mcp-server-tme' not found on PATH",
        "error: agents/demo-agent/config.yaml: brain: OPENAI_API_KEY is not set; openai model "
        "'gpt-4o-mini' needs it",
        f"warning: HUB_API_KEY: {PLAIN_SECRET}",
        f"warning: MCP_AUTH_TOKEN: {PLAIN_SECRET}",
        f"error: HUB_API_KEY: the Hub at {stack.hub.url} refuses HUB_API_KEY (HTTP 401)",
    ]
    as_json = json.loads(agent_worker(["check", "--json"], env, tmp_path).stdout)
    assert as_json["ok"] is False and (as_json["errors"], as_json["warnings"]) == (4, 4)


PLAIN_SECRET = (
    "is short or plain words: every occurrence of its value is masked in posts, logs and "
    "reports, so ordinary text that contains it is corrupted; use a random value of at least "
    "16 letters and digits"
)


def test_check_catches_what_breaks_every_task_of_an_agent(
    stack: Stack, redis_url: str, tmp_path: Path
) -> None:
    env = {
        **setup(tmp_path, stack.mcp.url),
        "REDIS_URL": redis_url,
        "HUB_URL": stack.hub.url,
        "HUB_API_KEY": HUB_KEY,
        "MCP_AUTH_TOKEN": MCP_TOKEN,
    }
    config = Path(env["AGENTS_DIR"]) / "agents" / "demo-agent" / "config.yaml"
    config.write_text(config.read_text().replace("- hub:read", "- hub:raed"))
    where = "agents/demo-agent/config.yaml"

    unset = agent_worker(["check", "--offline"], env, tmp_path)
    assert unset.returncode == 1
    assert unset.stdout.splitlines()[:-1] == [
        f"error: {where}: brain: OPENAI_API_KEY is not set; openai model 'gpt-4o-mini' needs it",
        f"warning: {where}: capabilities.grants: 'hub:raed' matches no tool of any MCP_CONFIG "
        "server (did you mean 'hub:read'?)",
    ]

    closed = free_port()
    down = {**env, "OPENAI_BASE_URL": f"http://127.0.0.1:{closed}/v1", "OPENAI_API_KEY": "short"}
    completed = agent_worker(["check", "--timeout", "2"], down, tmp_path)
    assert completed.returncode == 0  # warnings only: the endpoint may start after the worker
    lines = completed.stdout.splitlines()
    endpoint_down = f"http://127.0.0.1:{closed}/v1 does not answer (ConnectError)"
    assert f"warning: {where}: brain: the model endpoint {endpoint_down}" in lines
    assert f"warning: OPENAI_API_KEY: {PLAIN_SECRET}" in lines
    assert "short" not in completed.stdout.replace("is short or", "")
    assert agent_worker(["check", "--strict", "--timeout", "2"], down, tmp_path).returncode == 1

    up = agent_worker(["check"], {**env, **stack.model_env}, tmp_path)
    assert "model endpoint" not in up.stdout and "OPENAI_API_KEY" not in up.stdout


def test_check_suggests_only_a_grant_of_the_same_service_and_warns_about_declined_keys(
    stack: Stack, tmp_path: Path
) -> None:
    env = {**setup(tmp_path, stack.mcp.url), **stack.model_env, "HUB_URL": stack.hub.url}
    config = Path(env["AGENTS_DIR"]) / "agents" / "demo-agent" / "config.yaml"
    text = config.read_text().replace("- hub:read", "- kubernetes:read\n    - hbu:read")
    text = text.replace("  shell:\n    enabled: false", "  shell:\n    enabled: true\n"
                        "  spawning:\n    can_propose: true")  # fmt: skip
    config.write_text(text)
    where = "agents/demo-agent/config.yaml"

    completed = agent_worker(["check", "--offline"], env, tmp_path)

    assert completed.returncode == 0, completed.stdout  # warnings: the agent still runs
    assert completed.stdout.splitlines()[:-1] == [
        f"warning: {where}: capabilities.shell.enabled: a native agent has no shell here (only "
        "a coding-agent CLI type runs commands, in its sandbox); its tools are MCP_CONFIG's "
        "servers",
        f"warning: {where}: capabilities.spawning.can_propose: this worker never creates or "
        "proposes agents (definitions come only from AGENTS_DIR); the key is ignored",
        f"warning: {where}: capabilities.grants: 'kubernetes:read' matches no tool of any "
        "MCP_CONFIG server",
        f"warning: {where}: capabilities.grants: 'hbu:read' matches no tool of any MCP_CONFIG "
        "server (did you mean 'hub:read'?)",
    ]


def test_check_uses_redis_url_flag_over_the_environment(redis_url: str, tmp_path: Path) -> None:
    env = {
        "AGENTS_DIR": str(SHIPPED_DEMO_AGENTS),
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    completed = agent_worker(["check", "--redis-url", redis_url, "--timeout", "1"], env, tmp_path)
    assert "error: REDIS_URL" not in completed.stdout
    assert "Redis answers" in completed.stdout


def test_operator_commands_exit_codes(
    redis_url: str, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    # REDIS_URL points nowhere: every command reaches the real Redis through --redis-url only.
    env = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "AGENTS_DIR": str(SHIPPED_DEMO_AGENTS),
    }
    flag = ["--redis-url", redis_url]
    assert agent_worker(["cancel", "t-typo", *flag], env, tmp_path).returncode == 2
    assert agent_worker(["steer", "t-typo", "hello", *flag], env, tmp_path).returncode == 2
    assert redis_conn.keys("agent-worker:*") == []  # nothing recorded for a typo
    report = agent_worker(["report", "t-typo", *flag], env, tmp_path)
    assert report.returncode == 2 and "unknown task" in report.stderr
    enqueue_task(redis_conn, {"task_id": "t-q", "type": "exploration", "agent_id": "demo-agent"})
    pending = agent_worker(["report", "t-q", *flag], env, tmp_path)
    assert pending.returncode == 2
    assert pending.stderr.strip() == "agent-worker report: t-q: no report yet (status queued)"
    steer = agent_worker([*flag, "steer", "t-q", "focus"], env, tmp_path)
    assert steer.returncode == 0 and "message queued" in steer.stdout
    cancel = agent_worker(["cancel", "t-q", *flag], env, tmp_path)
    assert cancel.returncode == 0 and "removed from the queue" in cancel.stdout
    nothing = agent_worker(["requeue", "--all", *flag], env, tmp_path)
    assert (nothing.returncode, nothing.stdout.strip()) == (0, "no failed tasks")
    status = agent_worker(["status", "--json", *flag], env, tmp_path)
    assert status.returncode == 0 and json.loads(status.stdout)["schema_version"] == 1
    down = agent_worker(["status"], env, tmp_path)
    assert down.returncode == 1 and "cannot reach Redis" in down.stderr
    version = agent_worker(["--version"], env, tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("agent-worker ")


def test_check_prints_each_definition_warning_once_and_logs_no_json_line(tmp_path: Path) -> None:
    env = setup(tmp_path, f"http://127.0.0.1:{free_port()}/mcp")
    config = Path(env["AGENTS_DIR"]) / "agents" / "demo-agent" / "config.yaml"
    config.write_text(config.read_text() + "behaviour: {}\n")

    completed = agent_worker(["check", "--offline"], env, tmp_path)

    typo = "unknown key 'behaviour' (did you mean 'behavior'?)"
    assert completed.stdout.count(typo) == 1, completed.stdout
    assert f"warning: agents/demo-agent/config.yaml: {typo}" in completed.stdout.splitlines()
    assert typo not in completed.stderr


def test_a_short_capability_key_is_one_line_naming_it_and_what_it_needs(tmp_path: Path) -> None:
    env = {**setup(tmp_path, f"http://127.0.0.1:{free_port()}/mcp"), "CAPABILITY_KEY": "short"}

    completed = agent_worker(["check", "--offline"], env, tmp_path)

    assert completed.returncode == 1
    assert completed.stdout.splitlines() == [
        "error: CAPABILITY_KEY: must be at least 32 characters (got 5); generate one with: "
        "openssl rand -hex 32",
        "check: 1 errors, 0 warnings",
    ]
