"""Agent definitions over real HTTP (as from R2 or Git raw), cached in a real Redis."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.definitions import SHIPPED_DEMO_AGENTS
from worker.agents import AgentStore
from worker.dev.post_proxy import LoopbackServer, serving
from worker.exceptions import AgentConfigError, InvalidTask

pytestmark = pytest.mark.integration


@dataclass
class DefinitionsServer:
    root: Path
    base_url: str
    requested: list[str] = field(default_factory=list)


class _RecordingHandler(SimpleHTTPRequestHandler):
    requested: list[str]

    def do_GET(self) -> None:
        self.requested.append(self.path)
        if "/broken/" in self.path:
            self.send_error(500, "storage backend failed")
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output clean."""


@pytest.fixture
def definitions_server(tmp_path: Path) -> Iterator[DefinitionsServer]:
    """A copy of the demo tree behind a real HTTP server on a free port."""
    root = tmp_path / "served"
    shutil.copytree(SHIPPED_DEMO_AGENTS, root)
    requested: list[str] = []
    handler = type("Handler", (_RecordingHandler,), {"requested": requested})
    with serving(LoopbackServer(partial(handler, directory=str(root)))) as server:
        yield DefinitionsServer(root=root, base_url=server.url, requested=requested)


def test_demo_agent_loads_over_http(definitions_server: DefinitionsServer) -> None:
    store = AgentStore(definitions_server.base_url)
    try:
        definition = store.load("demo-agent")
    finally:
        store.close()

    assert definition.config.brain.model == "gpt-4o-mini"
    assert [skill.name for skill in definition.skills] == ["hub-etiquette"]
    assert "Skill: hub-etiquette" in definition.full_system_prompt()
    assert definitions_server.requested == [
        "/agents/demo-agent/config.yaml",
        "/agents/demo-agent/system-prompt.md",
        "/skills/hub-etiquette/SKILL.md",
    ]


def test_query_token_reaches_the_server_and_stays_out_of_errors(
    definitions_server: DefinitionsServer,
) -> None:
    store = AgentStore(definitions_server.base_url + "/?token=s3cr3t")
    try:
        store.load("demo-agent")
        with pytest.raises(InvalidTask) as caught:
            store.load("ghost-agent")
    finally:
        store.close()

    assert definitions_server.requested[0] == "/agents/demo-agent/config.yaml?token=s3cr3t"
    assert "s3cr3t" not in caught.value.message


def test_missing_config_over_http_is_an_unknown_agent(
    definitions_server: DefinitionsServer,
) -> None:
    store = AgentStore(definitions_server.base_url)
    try:
        with pytest.raises(InvalidTask) as caught:
            store.load("ghost-agent")
    finally:
        store.close()

    assert caught.value.message == (
        f"unknown agent 'ghost-agent': no agents/ghost-agent/config.yaml in "
        f"{definitions_server.base_url}"
    )


def test_server_error_names_the_url(definitions_server: DefinitionsServer) -> None:
    store = AgentStore(definitions_server.base_url + "/broken")
    try:
        with pytest.raises(AgentConfigError) as caught:
            store.load("demo-agent")
    finally:
        store.close()

    assert caught.value.message == (
        f"{definitions_server.base_url}/broken/agents/demo-agent/config.yaml: HTTP 500"
    )


def test_missing_skill_over_http_names_the_skill(definitions_server: DefinitionsServer) -> None:
    (definitions_server.root / "skills" / "hub-etiquette" / "SKILL.md").unlink()
    store = AgentStore(definitions_server.base_url)
    try:
        with pytest.raises(AgentConfigError, match=r"^skills/hub-etiquette/SKILL.md: not found"):
            store.load("demo-agent")
    finally:
        store.close()


def test_redis_cache_spares_the_http_reads_until_invalidated(
    definitions_server: DefinitionsServer, redis_conn: redis.Redis
) -> None:
    first_worker = AgentStore(definitions_server.base_url, redis=redis_conn, ttl_s=300)
    second_worker = AgentStore(definitions_server.base_url, redis=redis_conn, ttl_s=300)
    try:
        loaded = first_worker.load("demo-agent")
        reads_after_first_load = len(definitions_server.requested)

        assert second_worker.load("demo-agent") == loaded
        assert len(definitions_server.requested) == reads_after_first_load
        assert 0 < int(redis_conn.ttl("agent-worker:agent:demo-agent")) <= 300

        assert second_worker.invalidate("demo-agent") == 1
        first_worker.load("demo-agent")
        assert len(definitions_server.requested) == 2 * reads_after_first_load
    finally:
        first_worker.close()
        second_worker.close()
