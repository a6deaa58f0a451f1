"""Start-up of a real `rq worker agents`: the checks of `agent-worker check` run first; a bad
setting or a missing AGENTS_DIR is one line and no traceback; METRICS_HOST is the bound address."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.definitions import write_agent
from tests.support.workers import parse_events, run_burst, running_worker, wait_until
from worker.dev.devstack import free_port
from worker.enqueue import enqueue_task

pytestmark = pytest.mark.integration

DEMO_AGENTS = Path(__file__).resolve().parents[2] / "worker" / "dev" / "demo" / "agents"
LOOPBACK_HEX, ANY_HEX = "0100007F", "00000000"


def start_worker(redis_url: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """``rq worker agents --burst`` with only these environment variables."""
    env = {
        "RQ_WORKER_CLASS": "worker.AgentWorker",
        "REDIS_URL": redis_url,
        "METRICS_PORT": "0",
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HUB_URL": "http://127.0.0.1:9",  # nothing listens: a warning, not an error
        **variables,
    }
    return run_burst(env, timeout_s=120, cwd=cwd)


def one_error_line(completed: subprocess.CompletedProcess[str]) -> str:
    assert completed.returncode == 2, completed.stderr
    assert "Traceback" not in completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.startswith("agent-worker:")]
    assert len(lines) == 1, completed.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("METRICS_PORT", "nope", "agent-worker: invalid setting METRICS_PORT:"),
        ("METRICS_HOST", "", "agent-worker: invalid setting METRICS_HOST:"),
        ("HUB_URL", "not-a-url", "agent-worker: invalid setting HUB_URL: must be an http(s) URL"),
        ("MCP_CONFIG", "/nonexistent/mcp.yaml", "agent-worker: error: MCP_CONFIG: "),
    ],
)
def test_a_bad_setting_stops_the_worker_with_one_line(
    redis_url: str, tmp_path: Path, variable: str, value: str, message: str
) -> None:
    completed = start_worker(
        redis_url, tmp_path, **{"AGENTS_DIR": str(DEMO_AGENTS), variable: value}
    )
    line = one_error_line(completed)
    assert line.startswith(message)
    assert variable in line or "mcp.yaml" in line


def test_a_missing_agents_dir_stops_the_worker_before_any_task(
    redis_url: str, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    enqueue_task(redis_conn, {"task_id": "t-1", "type": "exploration", "agent_id": "demo-agent"})
    completed = start_worker(redis_url, tmp_path, AGENTS_DIR=str(tmp_path / "definitions"))
    assert one_error_line(completed) == (
        f"agent-worker: error: AGENTS_DIR: {tmp_path / 'definitions'} does not exist"
    )
    assert redis_conn.lrange("rq:queue:agents", 0, -1) == [b"t-1"]  # untouched, not failed


def test_a_mistyped_stdio_mcp_command_stops_the_worker(redis_url: str, tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text('servers:\n  time: {command: mcp-server-tme, tools: {"*": time:read}}\n')
    completed = start_worker(redis_url, tmp_path, AGENTS_DIR=str(DEMO_AGENTS), MCP_CONFIG=str(mcp))
    assert one_error_line(completed) == (
        f"agent-worker: error: MCP_CONFIG ({mcp}): servers.time.command: "
        "'mcp-server-tme' not found on PATH"
    )


def test_a_broken_definition_is_logged_and_fails_only_its_tasks_in_one_line(
    redis_url: str, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    hot = "name: hot-agent\nbrain: {provider: openai, model: m, temperature: 9}\n"
    write_agent(tmp_path, "hot-agent", hot)
    enqueue_task(redis_conn, {"task_id": "t-hot", "type": "exploration", "agent_id": "hot-agent"})
    completed = start_worker(redis_url, tmp_path, AGENTS_DIR=str(tmp_path))
    assert completed.returncode == 0, completed.stderr
    problems = parse_events(completed.stderr, "config_problem")
    (problem,) = [p for p in problems if p["agent"] == "hot-agent"]
    assert problem["level"] == "error"
    assert problem["subject"] == "agents/hot-agent/config.yaml"
    failures = [e for e in parse_events(completed.stderr, "rq_log") if "t-hot" in e["message"]]
    (failure,) = [e for e in failures if e["level"] == "error"]
    assert "\n" not in failure["message"] and "brain.temperature" in failure["message"]
    assert "Traceback" not in completed.stderr


def test_a_redis_url_of_the_wrong_scheme_is_named_by_check(tmp_path: Path) -> None:
    # rq builds its connection before our code runs, so `rq worker` itself cannot say it in
    # one line (docs/contract.md, trap 17); `agent-worker check` does.
    completed = subprocess.run(
        [str(Path(sys.executable).parent / "agent-worker"), "check", "--offline"],
        env={"PATH": "/usr/bin:/bin", "REDIS_URL": "http://x", "AGENTS_DIR": str(DEMO_AGENTS)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert completed.returncode == 1
    assert completed.stdout.splitlines()[0] == (
        "error: REDIS_URL: must start with redis://, rediss:// or unix://, got 'http://x'"
    )


def listening_address(port: int) -> str | None:
    """The local address (hex, as /proc/net/tcp writes it) of the socket listening on ``port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, port_hex = fields[1].split(":")
        if int(port_hex, 16) == port and fields[3] == "0A":  # 0A: LISTEN
            return address
    return None


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
@pytest.mark.parametrize(("host", "expected"), [("127.0.0.1", LOOPBACK_HEX), (None, ANY_HEX)])
def test_metrics_host_is_the_address_the_metrics_server_binds(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, host: str | None, expected: str
) -> None:
    if host is None:
        monkeypatch.delenv("METRICS_HOST", raising=False)
    else:
        monkeypatch.setenv("METRICS_HOST", host)
    port = free_port()
    with running_worker(redis_url, metrics_port=port) as worker:
        started = worker.wait_for_event("metrics_server_started")
        bound = wait_until(lambda: listening_address(started["port"]), 10, "a listening socket")
    assert started["host"] == (host or "0.0.0.0")
    assert bound == expected
