"""One MCP session per first-party HTTP server per worker process, through the real worker.

A worker running four tasks at once (``WORKER_CONCURRENCY=4``) keeps one session to mcp-hub
and one to the test toolkit served over HTTP (first-party, behind ``MCP_AUTH_TOKEN``, its
``echo`` tool answers the ``_meta`` it received). Each test reads the worker's
``mcp_shared_session_opened`` / ``_lost`` / ``_retry`` events to see the sessions it kept.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chaos.harness import (
    REPO_ROOT,
    ChaosStack,
    WorkerProcess,
    agent_config,
    unique,
    wait_until,
)
from tests.support import SERVER_READY_TIMEOUT_S
from tests.support.definitions import write_agent
from tests.support.redis_server import free_port
from worker.dev.devstack import ManagedProcess, python_module

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

SESSION_AGENT = "session-agent"
CONCURRENCY = "4"


@contextmanager
def toolkit_over_http(stack: ChaosStack, name: str, module: str) -> Iterator[ManagedProcess]:
    """A test toolkit ``module`` over streamable HTTP, asking for the worker's MCP_AUTH_TOKEN."""
    port = free_port()
    server = ManagedProcess(
        name,
        python_module(f"tests.support.mcp_test_servers.{module}", "--port", str(port)),
        port,
        {"MCP_AUTH_TOKEN": stack.canaries.mcp_auth_token, "PYTHONPATH": str(REPO_ROOT)},
    )
    server.start(ready_timeout_s=SERVER_READY_TIMEOUT_S)
    try:
        yield server
    finally:
        server.stop()
        server.remove_log()


@pytest.fixture(scope="module")
def kit(chaos_stack: ChaosStack) -> Iterator[ManagedProcess]:
    with toolkit_over_http(chaos_stack, "kit-http", "toolkit") as server:
        yield server


@pytest.fixture
def start_worker(chaos: ChaosStack, kit: ManagedProcess) -> Callable[..., WorkerProcess]:
    """Starts a worker running four tasks at once, with the hub and the HTTP toolkit
    first-party (the one on ``kit_port``), each tool call bounded by ``mcp_timeout_s``."""

    def start(mcp_timeout_s: float = 30, kit_port: int = kit.port) -> WorkerProcess:
        config_path = chaos.workdir / f"{unique('mcp-shared')}.yaml"
        _write_mcp_config(config_path, chaos.mcp_config, kit_port)
        write_agent(
            chaos.agents_dir,
            SESSION_AGENT,
            agent_config(
                SESSION_AGENT,
                capabilities={
                    "grants": ["hub:read", "hub:write", "kit:use"],
                    "mcp_servers": ["hub", "kit"],
                },
            ),
        )
        return chaos.start_worker(
            WORKER_CONCURRENCY=CONCURRENCY,
            MCP_CONFIG=str(config_path),
            MCP_TIMEOUT_S=str(mcp_timeout_s),
        )

    return start


def test_two_tasks_on_one_session_each_send_and_see_only_their_own_capability(
    chaos: ChaosStack, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker()
    # Both tasks are in flight together on the same two sessions. B asks mcp-hub to comment
    # on A's thread, which A's capability allows and B's does not: it must be refused.
    task_a, task_b = unique("own-a"), unique("own-b")
    thread_a, thread_b = _thread(chaos, task_a), _thread(chaos, task_b)
    _script(chaos, task_a, [_echo("from A"), _comment(thread_a, "A writes here")], "A done")
    _script(chaos, task_b, [_echo("from B"), _comment(thread_a, "B intrudes")], "B done")
    _enqueue(chaos, task_a, thread_a)
    _enqueue(chaos, task_b, thread_b)
    for task_id in (task_a, task_b):
        assert chaos.wait_for_status(task_id, timeout_s=120) == "finished"

    comments = [c["content"] for c in chaos.replies_to(thread_a, SESSION_AGENT)]
    assert "A writes here" in comments
    assert "B intrudes" not in comments
    assert [r["tool"] for r in chaos.report(task_b)["refused_writes"]] == ["hub__create_comment"]
    for task_id, other, text in ((task_a, task_b, "from A"), (task_b, task_a, "from B")):
        (echoed,) = [m for m in _echoed_meta(chaos, task_id) if m["text"] == text]
        assert echoed["meta"]["task_id"] == task_id
        # Scrubbed by the task's own toolbox: the capability it sent, not another's.
        assert echoed["meta"]["capability"] == "[capability]"
        assert other not in json.dumps(chaos.llm.requests(task_id))
    assert _opened(worker) == {"hub": 1, "kit": 1}


def test_a_tool_the_server_adds_is_offered_to_the_next_task_on_the_same_session(
    chaos: ChaosStack, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker()
    # The tool list is kept per session until the server says it changed (tools
    # list_changed): the next task sees the new tool without a new session.
    added = f"extra_{unique('t').split('-')[1]}"
    first, second = unique("grow"), unique("grown")
    _script(chaos, first, [{"name": "kit__grow", "arguments": {"name": added}}], "grown")
    _script(chaos, second, [], "seen")
    _enqueue(chaos, first, _thread(chaos, first))
    assert chaos.wait_for_status(first, timeout_s=120) == "finished"
    assert f"kit__{added}" not in _offered(chaos, first)
    _enqueue(chaos, second, _thread(chaos, second))
    assert chaos.wait_for_status(second, timeout_s=120) == "finished"

    assert f"kit__{added}" in _offered(chaos, second)
    assert _opened(worker) == {"hub": 1, "kit": 1}
    assert worker.events("mcp_shared_session_lost") == []


def test_a_keyed_call_in_flight_when_its_server_restarts_is_sent_again_on_a_new_session(
    chaos: ChaosStack, start_worker: Callable[..., WorkerProcess], kit: ManagedProcess
) -> None:
    worker = start_worker()
    # The toolkit is killed while a task's call sleeps in it, then started again on its
    # port: the call (it carries an idempotency key) is sent once more on a new session.
    task_id = unique("restart")
    _script(chaos, task_id, [{"name": "kit__slow", "arguments": {"seconds": 2}}], "survived")
    _enqueue(chaos, task_id, _thread(chaos, task_id))
    wait_until(lambda: "slow started: 2" in kit.log_tail(), 90, "the call to reach the kit")
    assert kit.process is not None
    kit.process.send_signal(signal.SIGKILL)
    kit.process.wait()
    kit.start(ready_timeout_s=SERVER_READY_TIMEOUT_S)
    assert chaos.wait_for_status(task_id, timeout_s=120) == "finished"

    assert any("slept 2" in result for result in _tool_results(chaos, task_id))
    assert _opened(worker)["kit"] == 2
    assert len(worker.events("mcp_shared_session_retry")) == 1


def test_a_session_the_server_forgot_is_opened_again_and_the_keyed_call_sent_once_more(
    chaos: ChaosStack, start_worker: Callable[..., WorkerProcess]
) -> None:
    # A server of the 2025 handshake gives the session an id; restarted, it answers that id
    # with 404. The next call opens a new session and is sent again there.
    with toolkit_over_http(chaos, "kit-legacy", "legacy_toolkit") as legacy:
        worker = start_worker(kit_port=legacy.port)
        before, after = unique("before"), unique("after")
        _script(chaos, before, [_echo("before the restart")], "one")
        _script(chaos, after, [_echo("after the restart")], "two")
        _enqueue(chaos, before, _thread(chaos, before))
        assert chaos.wait_for_status(before, timeout_s=120) == "finished"
        legacy.stop()
        legacy.start(ready_timeout_s=SERVER_READY_TIMEOUT_S)
        _enqueue(chaos, after, _thread(chaos, after))
        assert chaos.wait_for_status(after, timeout_s=120) == "finished"

    (echoed,) = _echoed_meta(chaos, after)
    assert echoed["text"] == "after the restart"
    protocols = [e["protocol"] for e in worker.events("mcp_shared_session_opened")]
    assert protocols.count("2025-11-25") == 2
    assert len(worker.events("mcp_shared_session_retry")) == 1


def test_a_call_its_deadline_cuts_off_leaves_its_neighbours_call_and_the_session_alone(
    chaos: ChaosStack, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(mcp_timeout_s=4)
    # MCP_TIMEOUT_S=4: A's 30 s call, sent at about 0.5 s, is cancelled at about 4.5 s while
    # B's 3 s call, sent at about 2.5 s, runs on the same session: B's is answered, and
    # neither task costs the session.
    task_a, task_b = unique("late"), unique("patient")
    slow_a = {"name": "kit__slow", "arguments": {"seconds": 30}}
    _script(chaos, task_a, [slow_a], "gave up", delay_s=0.5)
    slow_b = {"name": "kit__slow", "arguments": {"seconds": 3}}
    _script(chaos, task_b, [slow_b], "waited", delay_s=2.5)
    _enqueue(chaos, task_a, _thread(chaos, task_a))
    _enqueue(chaos, task_b, _thread(chaos, task_b))
    for task_id in (task_a, task_b):
        assert chaos.wait_for_status(task_id, timeout_s=120) == "finished"

    assert any("timed out after 4.0 s" in result for result in _tool_results(chaos, task_a))
    assert any("slept 3" in result for result in _tool_results(chaos, task_b))
    assert _opened(worker) == {"hub": 1, "kit": 1}
    assert worker.events("mcp_shared_session_lost") == []


# -- helpers ----------------------------------------------------------------------------------


def _write_mcp_config(path: Path, stack_config: Path, kit_port: int) -> None:
    """The stack's servers, with ``kit`` the HTTP toolkit, first-party, all its tools mapped."""
    config = yaml.safe_load(stack_config.read_text(encoding="utf-8"))
    config["servers"]["kit"] = {
        "url": f"http://127.0.0.1:{kit_port}/mcp",
        "first_party": True,
        "tools": {"*": "kit:use"},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def _thread(chaos: ChaosStack, task_id: str) -> str:
    """The post ``task_id`` answers; the scripted model picks its scenario by the marker."""
    return chaos.seed_post(f"@{SESSION_AGENT} can you help? [[scenario:{task_id}]]")


def _echo(text: str) -> dict[str, Any]:
    return {"name": "kit__echo", "arguments": {"text": text}}


def _comment(post_id: str, content: str) -> dict[str, Any]:
    return {"name": "hub__create_comment", "arguments": {"post_id": post_id, "content": content}}


def _script(
    chaos: ChaosStack,
    task_id: str,
    calls: Sequence[Mapping[str, Any]],
    answer: str,
    *,
    delay_s: float = 1,
) -> None:
    """The task's model: one turn of ``calls`` (``delay_s`` into it, so tasks overlap),
    then ``answer``."""
    turns: list[dict[str, Any]] = []
    if calls:
        turns.append({"tool_calls": list(calls), "delay_s": delay_s})
    turns.append({"text": answer})
    chaos.llm.set_scenario(task_id, turns)


def _enqueue(chaos: ChaosStack, task_id: str, post_id: str) -> None:
    task = {
        "task_id": task_id,
        "type": "notification",
        "agent_id": SESSION_AGENT,
        "post_id": post_id,
    }
    assert chaos.enqueue(task) == "enqueued"


def _opened(worker: WorkerProcess) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in worker.events("mcp_shared_session_opened"):
        counts[event["server"]] = counts.get(event["server"], 0) + 1
    return counts


def _tool_results(chaos: ChaosStack, task_id: str) -> list[str]:
    """What the task's tool calls answered, as its model read them."""
    return [
        str(message.get("content"))
        for request in chaos.llm.requests(task_id)
        for message in request["body"]["messages"]
        if message.get("role") == "tool"
    ]


def _echoed_meta(chaos: ChaosStack, task_id: str) -> list[dict[str, Any]]:
    """What ``echo`` answered the task (inside the untrusted-content delimiters)."""
    echoed: list[dict[str, Any]] = []
    for result in _tool_results(chaos, task_id):
        start = result.find('{"text": ')
        if start >= 0:
            value, _ = json.JSONDecoder().raw_decode(result, start)
            echoed.append(value)
    return echoed


def _offered(chaos: ChaosStack, task_id: str) -> set[str]:
    """The tool names the task's first model request offered."""
    first = chaos.llm.requests(task_id)[0]
    return {tool["function"]["name"] for tool in (first.get("body") or {}).get("tools", [])}
