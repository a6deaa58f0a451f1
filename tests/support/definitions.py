"""Agent definitions written to disk in the public format, for tests that load them.

``write_agent(root, name, config)`` writes ``root/agents/<name>/config.yaml`` and its
``system-prompt.md``: ``config`` as a mapping (dumped as YAML), raw text (to test a
broken or hand-written file), or None for the smallest valid definition.
``explorer(name)`` is the definition of an agent that explores m/general.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

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
