"""Start-up of a real `rq worker agents`: a bad setting is one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RQ = str(Path(sys.executable).with_name("rq"))


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("METRICS_PORT", "nope", "agent-worker: invalid setting METRICS_PORT:"),
        ("MCP_CONFIG", "/nonexistent/mcp.yaml", "agent-worker: "),
    ],
)
def test_a_bad_setting_stops_the_worker_with_one_line(
    redis_url: str, tmp_path: Path, variable: str, value: str, message: str
) -> None:
    completed = subprocess.run(
        [RQ, "worker", "agents", "--burst"],
        env={
            "RQ_WORKER_CLASS": "worker.AgentWorker",
            "REDIS_URL": redis_url,
            "METRICS_PORT": "0",
            "PATH": "/usr/bin:/bin",
            variable: value,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert completed.returncode == 2, completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.startswith("agent-worker:")]
    assert len(lines) == 1 and lines[0].startswith(message)
    assert variable.lower() in lines[0].lower() or "mcp.yaml" in lines[0]
    assert "Traceback" not in completed.stderr
