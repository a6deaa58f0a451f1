"""Start-up of a real `rq worker agents`: the checks of `agent-worker check` run first; a bad
setting, a missing or unreadable AGENTS_DIR, a Hub refusing HUB_API_KEY is one line and no
traceback, an unreachable Redis one JSON line naming REDIS_URL; METRICS_HOST is the bound
address."""

from __future__ import annotations

import codecs
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.definitions import SHIPPED_DEMO_AGENTS, write_agent
from tests.support.devhub import running_devhub
from tests.support.unprivileged import call_unprivileged
from tests.support.workers import (
    blocked_signals,
    parse_events,
    run_burst,
    running_worker,
    wait_until,
)
from worker.dev.devstack import free_port
from worker.enqueue import enqueue_task
from worker.operations import check_at_start
from worker.operations import main as operations_main
from worker.settings import Settings

pytestmark = pytest.mark.integration

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
        redis_url, tmp_path, **{"AGENTS_DIR": str(SHIPPED_DEMO_AGENTS), variable: value}
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


def test_an_empty_agents_dir_only_warns_and_the_worker_starts(
    redis_url: str, tmp_path: Path
) -> None:
    # As deploy/README.md says: a fleet without agents yet, not a broken one.
    (tmp_path / "definitions").mkdir()
    completed = start_worker(redis_url, tmp_path, AGENTS_DIR=str(tmp_path / "definitions"))
    assert completed.returncode == 0, completed.stderr
    problems = parse_events(completed.stderr, "config_problem")
    (problem,) = [event for event in problems if event["subject"] == "AGENTS_DIR"]
    assert (
        problem["level"] == "warning" and "has no agents/<name>/config.yaml" in problem["problem"]
    )
    assert parse_events(completed.stderr, "worker_started")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory any user may enter (pytest's tmp_path is its owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="agent-worker-shared-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_an_agents_dir_it_may_not_read_stops_check_and_the_worker_with_one_line(
    shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    definitions = shared_dir / "definitions"
    shutil.copytree(SHIPPED_DEMO_AGENTS, definitions)
    (definitions / "agents").chmod(0o000)  # as a deploy with the wrong owner leaves it
    monkeypatch.setenv("AGENTS_DIR", str(definitions))
    monkeypatch.setenv("HUB_URL", "http://127.0.0.1:9")
    unreadable = f"AGENTS_DIR: {definitions / 'agents'} cannot be read (Permission denied)"
    for encoding in ("utf-8-sig", "idna"):  # the child may not read the interpreter's files
        codecs.lookup(encoding)

    check = call_unprivileged(lambda: operations_main(["check", "--offline"]))
    start = call_unprivileged(lambda: check_at_start(Settings(), timeout_s=0.5))  # type: ignore[call-arg]

    (definitions / "agents").chmod(0o755)
    assert check.status == 1 and "Traceback" not in check.output, check.output
    assert [line for line in check.output.splitlines() if "AGENTS_DIR" in line] == [
        f"error: {unreadable}"
    ]
    assert start.status == 2 and "Traceback" not in start.output, start.output
    assert f"agent-worker: error: {unreadable}" in start.output.splitlines()


def test_a_hub_that_refuses_hub_api_key_stops_the_worker_with_one_line(
    redis_url: str, tmp_path: Path
) -> None:
    with running_devhub(api_key="the-hubs-own-key-0123456789") as hub:
        completed = start_worker(
            redis_url,
            tmp_path,
            AGENTS_DIR=str(SHIPPED_DEMO_AGENTS),
            OPENAI_API_KEY="sk-start-5e0d2b7a9c4f1836",
            HUB_URL=hub.url,
            HUB_API_KEY="a-wrong-key-9876543210abcdef",
        )
    assert one_error_line(completed) == (
        f"agent-worker: error: HUB_API_KEY: the Hub at {hub.url} refuses HUB_API_KEY (HTTP 401)"
    )


def test_an_unreachable_redis_stops_rq_worker_with_one_json_line_naming_redis_url(
    tmp_path: Path,
) -> None:
    closed = f"redis://:a-password-0123456789@127.0.0.1:{free_port()}/0"
    completed = start_worker(
        closed, tmp_path, AGENTS_DIR=str(SHIPPED_DEMO_AGENTS), RQ_CONFIG="worker.rq_config",
        REDIS_PATIENCE_S="0.5",
    )  # fmt: skip

    assert completed.returncode == 1
    (event,) = [json.loads(line) for line in completed.stderr.splitlines()]
    assert (event["event"], event["variable"]) == ("redis_unavailable", "REDIS_URL")
    assert event["redis"] == closed.replace(":a-password-0123456789@", "")
    assert event["error"] == "ConnectionError" and "a-password" not in completed.stderr


def test_a_mistyped_stdio_mcp_command_stops_the_worker(redis_url: str, tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text('servers:\n  time: {command: mcp-server-tme, tools: {"*": time:read}}\n')
    completed = start_worker(
        redis_url, tmp_path, AGENTS_DIR=str(SHIPPED_DEMO_AGENTS), MCP_CONFIG=str(mcp)
    )
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
        env={
            "PATH": "/usr/bin:/bin",
            "REDIS_URL": "http://x",
            "AGENTS_DIR": str(SHIPPED_DEMO_AGENTS),
        },
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


def test_the_workers_own_threads_leave_rqs_signals_to_its_main_thread(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel hands a signal sent to the worker to any thread not blocking it, and one in
    # a thread other than the main one would not wake rq's wait on the queue.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # a batch thread
    with running_worker(redis_url, metrics_port=free_port()) as worker:  # a server thread
        pid = worker.process.pid
        threads = {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}
        blocked = {tid: blocked_signals(pid, tid) for tid in threads}

    rqs = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}
    assert not blocked.pop(pid) & rqs  # the main thread takes them
    assert len(blocked) >= 2, blocked
    for tid, signals in blocked.items():
        assert rqs <= signals, (tid, signals)
