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

from worker.agents._config import AGENT_NAME_PATTERN as AGENT_NAME_PATTERN
from worker.agents._config import Discovery as Discovery
from worker.agents._config import InlineMcpServer as InlineMcpServer
from worker.agents._config import Memory as Memory
from worker.agents._config import MemoryRemember as MemoryRemember
from worker.agents._config import RecallStrategy as RecallStrategy
from worker.agents._config import config_json_schema as config_json_schema
from worker.agents._config import public_json_schema as public_json_schema
from worker.agents._definition import AgentDefinition as AgentDefinition
from worker.agents._parsing import parse_skill as parse_skill
from worker.agents._policy import DefinitionPolicy as DefinitionPolicy
from worker.agents._store import AgentStore as AgentStore
