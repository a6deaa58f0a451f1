"""docs/first-agent.md works as written: its shell blocks, run in order as one script."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from worker.dev.devstack import free_port

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "first-agent.md"
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def shell_blocks(page: Path) -> list[str]:
    return SHELL_BLOCK.findall(page.read_text(encoding="utf-8"))


def guide_script() -> str:
    blocks = shell_blocks(GUIDE)
    assert len(blocks) >= 8, "the guide lost its shell blocks"
    return "set -euo pipefail\n" + "\n".join(blocks)


def run_script(
    tmp_path: Path, text: str, *, typed: str = "", **ports: int
) -> tuple[subprocess.Popen[str], str, str]:
    """Run a guide's script as a user's bash would, in ``tmp_path``, on free ports;
    ``typed`` is what the user types at its prompts."""
    script = tmp_path / "guide.sh"
    script.write_text(text, encoding="utf-8")
    venv_bin = str(Path(sys.executable).parent)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REDIS_", "RQ_", "HUB_", "OPENAI_", "ANTHROPIC_", "MCP_"))
        and key not in {"AGENTS_DIR", "METRICS_PORT", "GRANT_POLICY", "PRICES_FILE"}
    }
    # The guide's own overridable ports, set to free ones (never 6379 or fixed ports).
    env.update(
        PATH=f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}",
        REDIS_PORT=str(free_port()),
        HUB_PORT=str(free_port()),
        LLM_PORT=str(free_port()),
        TMPDIR=str(tmp_path),  # where the guide's scratch directory goes
        **{name: str(port) for name, port in ports.items()},
    )
    process = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(typed, timeout=180)
    finally:
        # The guide stops its background processes itself; this only catches a failed run.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process, stdout, stderr


def test_the_first_agent_guide_runs_as_written(tmp_path: Path) -> None:
    process, stdout, stderr = run_script(tmp_path, guide_script())
    scratch = [path for path in tmp_path.iterdir() if path.name.startswith("first-agent.")]
    logs = [scratch[0] / "worker.log"] if scratch else []
    worker_log = logs[0].read_text() if logs and logs[0].exists() else ""
    assert process.returncode == 0, f"{stdout[-3000:]}\n{stderr[-3000:]}\n{worker_log[-3000:]}"
    # Nothing in the directory it was started from (a checkout): all in its scratch directory.
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["guide.sh", scratch[0].name])
    assert {"my-agents", "worker.log", "redis.log"} <= {p.name for p in scratch[0].iterdir()}
    assert "check: 0 errors, 0 warnings" in stdout
    assert "1 of 1 agent definitions load; 1 skills parse" in stdout
    assert "enqueued first-1" in stdout
    assert "task first-1 (notification, agent hello-agent): completed" in stdout
    # The scripted answer reached the Hub as a comment on the seeded post.
    assert stdout.count("Welcome aboard! m/general is the place to start.") >= 2
    assert '"author"' in stdout and "hello-agent" in stdout


def test_the_tool_guide_runs_in_the_first_agents_shell(tmp_path: Path) -> None:
    # The first agent's guide up to its last block (which stops the background processes),
    # then the tool guide's block, then that last block.
    first = shell_blocks(GUIDE)
    (tools,) = shell_blocks(DOCS / "how-to" / "tools.md")
    script = "set -euo pipefail\n" + "\n".join([*first[:-1], tools, first[-1]])
    process, stdout, stderr = run_script(tmp_path, script, MCP_HUB_PORT=free_port())
    assert process.returncode == 0, f"{stdout[-3000:]}\n{stderr[-3000:]}"
    checks = [line for line in stdout.splitlines() if line.startswith("check: ")]
    assert checks[-1] == (
        "check: 0 errors, 0 warnings; Redis answers; 1 of 1 agent definitions load; "
        "1 skills parse; 1 MCP servers configured; the Hub answers"
    )


def test_the_hosted_model_guide_runs_with_the_scripted_endpoint_as_the_provider(
    tmp_path: Path,
) -> None:
    # The first agent's shell, then the hosted-model guide's blocks as written, with its
    # config.yaml example written where the guide says. The scripted endpoint stands in for
    # Anthropic (ANTHROPIC_BASE_URL, the one line this test adds) and answers the model the
    # guide names; the key is typed at the guide's prompt.
    first = shell_blocks(GUIDE)
    guide = DOCS / "how-to" / "hosted-model.md"
    key, check, task = shell_blocks(guide)
    (config,) = re.findall(r"^```yaml\n(.*?)^```$", guide.read_text(encoding="utf-8"), re.S | re.M)
    provider = (
        'export ANTHROPIC_BASE_URL="http://127.0.0.1:$LLM_PORT"\n'
        f"cat > my-agents/agents/hello-agent/config.yaml <<'EOF'\n{config}EOF\n"
        'curl -sf "http://127.0.0.1:$LLM_PORT/_scripted/scenarios" '
        "-H 'Content-Type: application/json' "
        """-d '{"name": "claude-sonnet-4-5", "turns": [{"text": "Hello from a hosted model."}]}'"""
    )
    script = "\n".join(["set -euo pipefail", *first[:-1], key, provider, check, task, first[-1]])
    process, stdout, stderr = run_script(tmp_path, script, typed="sk-ant-guide-7d1c58e2b9a04f36\n")
    assert process.returncode == 0, f"{stdout[-3000:]}\n{stderr[-3000:]}"
    checks = [line for line in stdout.splitlines() if line.startswith("check: ")]
    assert checks[-1].startswith("check: 0 errors, 0 warnings"), stdout[-3000:]
    assert "task hosted-1 (notification, agent hello-agent): completed" in stdout
    assert "Hello from a hosted model." in stdout
    assert "sk-ant-guide-7d1c58e2b9a04f36" not in stdout + stderr


TURN_LINE = re.compile(r'^\{"tool_calls": .*\}$', re.MULTILINE)


@pytest.mark.anyio
async def test_the_guides_tool_calls_are_valid_for_the_hub_tools() -> None:
    import jsonschema

    from mcp_servers import hub as hub_server

    tools = {
        f"hub__{tool.name}": tool.input_schema
        for tool in await hub_server.build_server(hub_url="http://127.0.0.1:9").list_tools()
    }
    turns = [json.loads(line) for line in TURN_LINE.findall(GUIDE.read_text(encoding="utf-8"))]
    calls = [call for turn in turns for call in turn["tool_calls"]]
    assert calls, "the guide shows no tool call"
    for call in calls:
        jsonschema.validate(call["arguments"], tools[call["name"]])
