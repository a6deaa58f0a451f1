"""A REDIS_URL an operator got wrong, through every command that reads it: one line naming
the variable and what is wrong, never a traceback. A bad port or database path is caught
before any connection (also by `check --offline`); a wrong password or a database the server
does not have is said as such, not as "does not answer"."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.definitions import SHIPPED_DEMO_AGENTS
from tests.support.redis_server import RedisProcess, free_port, spawn_redis
from tests.support.workers import run_burst, wait_until
from worker.dev.devstack import redis_server_command

pytestmark = pytest.mark.integration

AGENT_WORKER = str(Path(sys.executable).parent / "agent-worker")
PASSWORD = "pw-for-this-test-only-81c2"
TASK_LINE = '{"task_id": "u-1", "type": "exploration", "agent_id": "demo-agent"}\n'

# Each command an operator runs against Redis, as typed.
COMMANDS = {
    "status": ["status"],
    "report": ["report", "u-1"],
    "enqueue": ["enqueue", "-"],
    "cancel": ["cancel", "u-1"],
    "schedule": ["schedule", "--once"],
}


def environment(redis_url: str) -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "REDIS_URL": redis_url,
        "AGENTS_DIR": str(SHIPPED_DEMO_AGENTS),
        "HUB_URL": "http://127.0.0.1:9",  # nothing listens; never reached here
        "METRICS_PORT": "0",
    }


def agent_worker(redis_url: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT_WORKER, *args],
        env=environment(redis_url),
        input=TASK_LINE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def rq_worker(redis_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **environment(redis_url),
        "RQ_WORKER_CLASS": "worker.AgentWorker",
        "RQ_CONFIG": "worker.rq_config",
    }
    return run_burst(env, timeout_s=120, cwd=cwd)


def only_line(completed: subprocess.CompletedProcess[str]) -> str:
    """The one line the command printed on stderr; it failed, without a traceback."""
    assert completed.returncode != 0, completed
    assert "Traceback" not in completed.stderr, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    return lines[0]


BAD_PORTS = {
    "redis://127.0.0.1:notaport/0": "'redis://127.0.0.1:notaport/0'",
    "redis://127.0.0.1:99999/0": "'redis://127.0.0.1:99999/0'",
}


@pytest.mark.parametrize("url", sorted(BAD_PORTS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_port_is_one_line_from_every_command(url: str, command: str, tmp_path: Path) -> None:
    line = only_line(agent_worker(url, *COMMANDS[command], cwd=tmp_path))
    assert line == (
        "agent-worker: invalid setting REDIS_URL: the port must be a number from 1 to 65535, "
        f"got {BAD_PORTS[url]}"
    )


@pytest.mark.parametrize("url", sorted(BAD_PORTS))
def test_a_bad_port_stops_the_rq_worker_in_one_line(url: str, tmp_path: Path) -> None:
    line = only_line(rq_worker(url, tmp_path))
    assert line.startswith("agent-worker: invalid setting REDIS_URL: the port must be a number")


@pytest.mark.parametrize("url", [*sorted(BAD_PORTS), "redis://127.0.0.1:6380/zero"])
def test_check_offline_catches_a_url_redis_cannot_use(url: str, tmp_path: Path) -> None:
    completed = agent_worker(url, "check", "--offline", cwd=tmp_path)
    assert completed.returncode == 1
    first = completed.stdout.splitlines()[0]
    assert first.startswith("error: REDIS_URL: the ")
    assert url in first


def test_the_bad_scheme_message_keeps_the_port_and_drops_the_password(tmp_path: Path) -> None:
    line = only_line(
        agent_worker("http://user:s3cret@redis.internal:6380/2", "status", cwd=tmp_path)
    )
    assert line == (
        "agent-worker: invalid setting REDIS_URL: must start with redis://, rediss:// or "
        "unix://, got 'http://redis.internal:6380/2'"
    )


@pytest.fixture(scope="module")
def guarded_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server with a password and 4 databases; yields its port."""
    workdir = tmp_path_factory.mktemp("guarded-redis")
    port = free_port()
    command = [*redis_server_command(port, str(workdir)), "--requirepass", PASSWORD]
    server = RedisProcess(port=port, process=spawn_redis([*command, "--databases", "4"]))
    try:
        client = redis.Redis(port=port, password=PASSWORD)
        wait_until(lambda: server.ask(lambda _: client.ping()), 30, "the guarded redis-server")
        client.close()
        yield port
    finally:
        server.stop()


WRONG_PASSWORD = "Redis refuses the password in REDIS_URL (wrong, or none given)"
NO_SUCH_DATABASE = (
    "Redis has no database with the number in REDIS_URL's path "
    "(DB index is out of range: the server's `databases` setting caps it)"
)


def refused_urls(port: int) -> list[tuple[str, str, str]]:
    """(REDIS_URL, the URL as printed, the refusal)."""
    shown = f"redis://127.0.0.1:{port}"
    return [
        (f"redis://:wrong-one@127.0.0.1:{port}/0", f"{shown}/0", WRONG_PASSWORD),
        (f"redis://127.0.0.1:{port}/0", f"{shown}/0", WRONG_PASSWORD),
        (f"redis://:{PASSWORD}@127.0.0.1:{port}/9", f"{shown}/9", NO_SUCH_DATABASE),
    ]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_refused_password_or_database_is_said_as_such(
    guarded_redis: int, command: str, tmp_path: Path
) -> None:
    for url, _, refusal in refused_urls(guarded_redis):
        line = only_line(agent_worker(url, *COMMANDS[command], cwd=tmp_path))
        # status, report and enqueue name themselves; cancel and schedule print through the CLI.
        assert line in {f"agent-worker {command}: {refusal}", f"agent-worker: {refusal}"}, url
        assert PASSWORD not in line


def test_the_rq_worker_and_check_say_a_refusal_as_such(guarded_redis: int, tmp_path: Path) -> None:
    for url, shown, refusal in refused_urls(guarded_redis):
        assert only_line(rq_worker(url, tmp_path)) == f"agent-worker: {refusal}", url
        completed = agent_worker(url, "check", cwd=tmp_path)
        assert completed.returncode == 1
        (redis_line,) = [line for line in completed.stdout.splitlines() if "REDIS_URL" in line]
        assert redis_line == f"error: REDIS_URL: {refusal} (at {shown})"
