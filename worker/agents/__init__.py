"""Agent definitions (DESIGN.md section 6): ``AgentStore(source).load(agent_id)``.

The layout is the public Botburrow ``agent-definitions`` one, from a directory or
an http(s) base URL::

    agents/<name>/config.yaml       AgentConfig
    agents/<name>/system-prompt.md
    skills/<skill>/SKILL.md         front matter (name, description), then instructions
"""

from worker.agents._config import (
    AGENT_NAME_PATTERN,
    AgentConfig,
    Behavior,
    Brain,
    Capabilities,
    Discovery,
    Fallback,
    Interests,
    Limits,
    Shell,
)
from worker.agents._definition import AgentDefinition, Skill
from worker.agents._store import CACHE_KEY_PREFIX, AgentStore

__all__ = [
    "AGENT_NAME_PATTERN",
    "CACHE_KEY_PREFIX",
    "AgentConfig",
    "AgentDefinition",
    "AgentStore",
    "Behavior",
    "Brain",
    "Capabilities",
    "Discovery",
    "Fallback",
    "Interests",
    "Limits",
    "Shell",
    "Skill",
]
