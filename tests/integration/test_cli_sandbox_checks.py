"""``agent-worker executors`` and ``agent-worker check`` say whether CLIs can be sandboxed.

Run as an operator runs them, with a PATH that lacks ``bwrap`` (so no bubblewrap is
needed here), and with ``CLI_SANDBOX=off``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.definitions import write_agent
from tests.support.workers import parse_events, run_burst

pytestmark = pytest.mark.integration

AGENT_WORKER = str(Path(sys.executable).with_name("agent-worker"))
MISSING = "CLI sandbox unavailable: `bwrap` (bubblewrap) is not installed on this worker"


def agent_worker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": "/nonexistent",
        "HOME": "/tmp",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        # check reports an agent whose provider key is unset: these agents have theirs.
        "ANTHROPIC_API_KEY": "sk-ant-sandbox-6Yh3Pq8Wz1Kc4Nm7",
    }
    return subprocess.run(
        [AGENT_WORKER, *args],
        capture_output=True,
        text=True,
        env=base | env,
        timeout=120,
        check=False,
    )


def test_executors_say_when_the_sandbox_is_missing_or_off() -> None:
    missing = agent_worker("executors")
    off = agent_worker("executors", CLI_SANDBOX="off")

    assert missing.returncode == 0, missing.stderr
    assert f"sandbox: {MISSING}" in missing.stdout
    assert "sandbox: off: coding-agent CLIs run unconfined (CLI_SANDBOX=off)" in off.stdout


def write_agents(root: Path) -> Path:
    for name, agent_type in (("cli-agent", "claude-code"), ("native-agent", "native")):
        brain = {"provider": "anthropic", "model": "claude-sonnet-4-5"}
        write_agent(root, name, {"name": name, "type": agent_type, "brain": brain})
    return root


def installed_claude(root: Path) -> str:
    """A directory holding an executable ``claude``: for ``check``, the CLI is installed."""
    directory = root / "bin"
    directory.mkdir()
    (directory / "claude").write_text("#!/bin/sh\necho 2.1.0\n")
    (directory / "claude").chmod(0o755)
    return str(directory)


def test_check_fails_each_cli_agent_while_the_sandbox_is_missing(tmp_path: Path) -> None:
    agents = write_agents(tmp_path)
    path = installed_claude(tmp_path)

    missing = agent_worker("check", "--offline", AGENTS_DIR=str(agents), PATH=path)
    off = agent_worker("check", "--offline", AGENTS_DIR=str(agents), CLI_SANDBOX="off", PATH=path)

    assert missing.returncode == 1
    [line] = [line for line in missing.stdout.splitlines() if "CLI_SANDBOX" in line]
    assert line.startswith(f"error: CLI_SANDBOX: {MISSING}")
    assert line.endswith("agent cli-agent's tasks fail until it works")
    assert off.returncode == 0, off.stdout
    assert "warning: CLI_SANDBOX: coding-agent CLIs run unconfined (CLI_SANDBOX=off)" in off.stdout


def test_check_fails_each_cli_agent_whose_cli_is_not_installed_naming_the_install(
    tmp_path: Path,
) -> None:
    agents = write_agents(tmp_path)

    checked = agent_worker("check", "--offline", AGENTS_DIR=str(agents), CLI_SANDBOX="off")
    listed = agent_worker("executors")

    assert checked.returncode == 1
    [line] = [line for line in checked.stdout.splitlines() if line.startswith("error:")]
    assert line.startswith(
        "error: agents/cli-agent/config.yaml: claude-code: the `claude` executable is not "
        "installed on this worker (install it with `npm install -g @anthropic-ai/claude-code`"
    )
    assert line.endswith("agent cli-agent's tasks fail until it is")
    assert "native-agent" not in checked.stdout.split("check:")[0]
    assert (
        "claude-code: not installed; install with `npm install -g @anthropic-ai/claude-code`"
        in (listed.stdout)
    )


def test_the_worker_starts_with_an_error_for_a_cli_agent_without_its_cli(
    redis_url: str, tmp_path: Path
) -> None:
    agents = write_agents(tmp_path)
    env = {
        "RQ_WORKER_CLASS": "worker.AgentWorker",
        "REDIS_URL": redis_url,
        "METRICS_PORT": "0",
        "PATH": str(Path(sys.executable).parent),  # the worker's own, and no `claude`
        "HUB_URL": "http://127.0.0.1:9",
        "AGENTS_DIR": str(agents),
        "ANTHROPIC_API_KEY": "sk-ant-sandbox-6Yh3Pq8Wz1Kc4Nm7",
        "CLI_SANDBOX": "off",
    }
    completed = run_burst(env, timeout_s=120, cwd=tmp_path)

    assert completed.returncode == 0, completed.stderr
    [problem] = [
        p
        for p in parse_events(completed.stderr, "config_problem")
        if p["agent"] == "cli-agent" and p["level"] == "error"
    ]
    assert "`claude` executable is not installed" in problem["problem"]
    assert "npm install -g @anthropic-ai/claude-code" in problem["problem"]
