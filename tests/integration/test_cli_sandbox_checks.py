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


def test_check_fails_each_cli_agent_while_the_sandbox_is_missing(tmp_path: Path) -> None:
    for name, agent_type in (("cli-agent", "claude-code"), ("native-agent", "native")):
        brain = {"provider": "anthropic", "model": "claude-sonnet-4-5"}
        write_agent(tmp_path, name, {"name": name, "type": agent_type, "brain": brain})

    missing = agent_worker("check", "--offline", AGENTS_DIR=str(tmp_path))
    off = agent_worker("check", "--offline", AGENTS_DIR=str(tmp_path), CLI_SANDBOX="off")

    assert missing.returncode == 1
    [line] = [line for line in missing.stdout.splitlines() if "CLI_SANDBOX" in line]
    assert line.startswith(f"error: CLI_SANDBOX: {MISSING}")
    assert line.endswith("agent cli-agent's tasks fail until it works")
    assert off.returncode == 0, off.stdout
    assert "warning: CLI_SANDBOX: coding-agent CLIs run unconfined (CLI_SANDBOX=off)" in off.stdout
