"""The YAML a guide tells a user to write is read as the guide says by the worker's own loaders.

Every ``yaml`` block of the getting-started pages and the how-to guides is one of: an
``MCP_CONFIG`` (``servers``), a ``GRANT_POLICY`` (``default``/``agents``), an agent's
``config.yaml`` (``name``) or a section of one (``memory``), or the Prometheus scrape job of
the operations page. A block that is none of them fails, so a new example gets a check.
The enqueue guide's task (JSON) parses as a task, and its Python runs as written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import yaml

from worker.agents import AgentStore
from worker.task import parse_task
from worker.tools import load_mcp_config
from worker.tools._grants import load_grant_policy

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```$", re.DOTALL | re.MULTILINE)
GUIDE_PAGES = sorted(
    [DOCS / "first-agent.md", *DOCS.glob("getting-started/*.md"), *DOCS.glob("how-to/*.md")]
)
EXAMPLES = [
    pytest.param(page, block, id=f"{page.relative_to(DOCS)}-{number}")
    for page in GUIDE_PAGES
    for number, block in enumerate(YAML_BLOCK.findall(page.read_text(encoding="utf-8")), 1)
]


def load_definition(tmp_path: Path, config: dict[str, Any]) -> None:
    agent = tmp_path / "agents" / config["name"]
    agent.mkdir(parents=True)
    (agent / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (agent / "system-prompt.md").write_text("You help on the Hub.", encoding="utf-8")
    definition = AgentStore(str(tmp_path)).load(config["name"])
    assert not definition.warnings, definition.warnings


def test_the_guides_have_yaml_examples() -> None:
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize(("page", "block"), EXAMPLES)
def test_each_yaml_example_is_read_as_the_guide_says(
    page: Path, block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = yaml.safe_load(block)
    path = tmp_path / "example.yaml"
    path.write_text(block, encoding="utf-8")
    if isinstance(document, list):
        # The worker's scrape job, as deploy/prometheus/prometheus.yml names it for the alerts.
        shipped = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
        names = {job["job_name"] for job in shipped["scrape_configs"]}
        assert [job["job_name"] for job in document] == ["agent-worker"]
        assert "agent-worker" in names
    elif "servers" in document:
        monkeypatch.setenv("GH_MCP_TOKEN", "example-token-0123456789abcdef")
        config = load_mcp_config(path)
        assert set(config.servers) == set(document["servers"])
    elif "default" in document or "agents" in document:
        policy = load_grant_policy(path)
        for agent in document.get("agents", {}):
            assert agent in policy.agents
    elif "name" in document:
        load_definition(tmp_path / "defs", document)
    elif set(document) == {"memory"}:
        brain = {"provider": "openai", "model": "gpt-4o-mini"}
        load_definition(tmp_path / "defs", {"name": "memory-agent", "brain": brain, **document})
    else:
        pytest.fail(f"{page.name}: a yaml example no check understands: {sorted(document)}")


ENQUEUE_GUIDE = DOCS / "how-to" / "enqueue.md"


def test_the_task_the_enqueue_guide_shows_is_a_valid_task() -> None:
    (block,) = re.findall(r"^```json\n(.*?)^```$", ENQUEUE_GUIDE.read_text(), re.S | re.M)
    task = parse_task(json.loads(block))
    assert task.constraints.allowed_tools == ["hub__search_posts"]


def test_the_enqueue_guides_python_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (block,) = re.findall(r"^```python\n(.*?)^```$", ENQUEUE_GUIDE.read_text(), re.S | re.M)
    fake = fakeredis.FakeRedis()
    monkeypatch.setattr(redis.Redis, "from_url", lambda url: fake)
    exec(compile(block, str(ENQUEUE_GUIDE), "exec"), {})
    exec(compile(block, str(ENQUEUE_GUIDE), "exec"), {})
    assert capsys.readouterr().out.split() == ["enqueued", "duplicate"]
    assert fake.lrange("rq:queue:agents", 0, -1) == [b"t-1"]
