"""Agent definitions written to disk in the public format, for tests that load them.

``write_agent(root, name, config)`` writes ``root/agents/<name>/config.yaml`` and its
``system-prompt.md``: ``config`` as a mapping (dumped as YAML), raw text (to test a
broken or hand-written file), or None for the smallest valid definition.
``explorer(name)`` is the definition of an agent that explores m/general;
``demo_agents()`` the demo agent as ``make demo`` runs it.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

import worker.dev.demo.__main__ as demo
from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig

OPENAI_BRAIN = {"provider": "openai", "model": "gpt-4o-mini"}


def write_agent(
    root: Path,
    name: str,
    config: Mapping[str, Any] | str | None = None,
    prompt: str | None = "",
) -> Path:
    """Write one agent's folder and return it; ``prompt`` None leaves out system-prompt.md,
    an empty one writes "You are <name>."."""
    folder = root / "agents" / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = {"name": name, "brain": OPENAI_BRAIN}
    text = config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False)
    (folder / "config.yaml").write_text(text, encoding="utf-8")
    if prompt is not None:
        (folder / "system-prompt.md").write_text(prompt or f"You are {name}.", encoding="utf-8")
    return folder


def agent_definition(name: str, *, system_prompt: str = "", **sections: Any) -> AgentDefinition:
    """Agent ``name`` in memory, its config ``sections`` over an OpenAI brain of model m."""
    config = AgentConfig.model_validate(
        {"name": name, "brain": {"provider": "openai", "model": "m"}, **sections}
    )
    return AgentDefinition(config=config, system_prompt=system_prompt)


def explorer(
    name: str, *, discovery: bool = True, brain: Mapping[str, Any] = OPENAI_BRAIN
) -> dict[str, Any]:
    """An agent interested in m/general and redis, with discovery on or off."""
    return {
        "name": name,
        "brain": dict(brain),
        "interests": {"communities": ["m/general"], "keywords": ["redis"]},
        "behavior": {"discovery": {"enabled": discovery}},
    }


# The demo agents as shipped; demo_agents() adds this worker's extensions to a copy.
SHIPPED_DEMO_AGENTS = demo.DEMO_AGENTS


@functools.cache
def demo_agents() -> Path:
    """The demo agent as ``make demo`` runs it: the shipped public-format definition with
    this worker's extensions added (its limits, ``post_final``), in a directory of its own
    that is removed when the test process exits."""
    target = Path(tempfile.mkdtemp(prefix="demo-agents-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    shutil.copytree(demo.DEMO_AGENTS, target, dirs_exist_ok=True)
    config_path = target / "agents" / demo.AGENT / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    demo.add_extensions(config)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return target
