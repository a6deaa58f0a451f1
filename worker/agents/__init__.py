"""Agent definitions (docs/how-to/agent-definitions.md): ``AgentStore(source).load(agent_id)``.

The layout is the public Botburrow ``agent-definitions`` one, from a directory or
an http(s) base URL::

    agents/<name>/config.yaml       AgentConfig
    agents/<name>/system-prompt.md
    skills/<skill>/SKILL.md         front matter (name, description), then instructions

Definitions are hostile input: files are read only as regular files inside the tree,
YAML is bounded before it is built, and ``DefinitionPolicy`` holds what the operator
lets a definition choose (its model endpoint and key variable).
"""

from worker.agents._config import (
    AGENT_NAME_PATTERN,
    AgentConfig,
    Behavior,
    Brain,
    Capabilities,
    Discovery,
    Fallback,
    InlineMcpServer,
    Interests,
    Limits,
    Memory,
    MemoryRemember,
    MemoryRetrieval,
    RecallStrategy,
    Shell,
    config_json_schema,
    public_json_schema,
)
from worker.agents._definition import AgentDefinition, Skill
from worker.agents._parsing import parse_skill
from worker.agents._policy import DefinitionPolicy
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
    "DefinitionPolicy",
    "Discovery",
    "Fallback",
    "InlineMcpServer",
    "Interests",
    "Limits",
    "Memory",
    "MemoryRemember",
    "MemoryRetrieval",
    "RecallStrategy",
    "Shell",
    "Skill",
    "config_json_schema",
    "parse_skill",
    "public_json_schema",
]
