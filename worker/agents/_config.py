"""The fields of ``agents/<name>/config.yaml`` (Botburrow agent-definitions format, plus ours).

Unknown keys do not stop a definition, so one written for other Botburrow runners
loads unchanged; each is reported as a warning (``_keys``), or refused under
``AGENTS_STRICT``. What a definition may choose (``api_base``, ``api_key_env``) is the
operator's to allow (``_policy``). A key left empty in YAML (``skills:`` with nothing after
it) means "use the default", as it does for those runners.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

AGENT_NAME_PATTERN = r"^[a-z0-9-]{3,50}$"
SKILL_NAME_PATTERN = r"^[a-z0-9-]{1,50}$"
# `svc:scope` or `svc:scope:resource`; `svc:*` holds every scope of the service.
GRANT_PATTERN = r"^[a-z0-9][a-z0-9_-]*:(\*|[a-z0-9][a-z0-9_-]*)(:[A-Za-z0-9_./*-]+)?$"

AgentName = Annotated[str, StringConstraints(pattern=AGENT_NAME_PATTERN)]
SkillName = Annotated[str, StringConstraints(pattern=SKILL_NAME_PATTERN)]
Grant = Annotated[str, StringConstraints(pattern=GRANT_PATTERN)]
EnvVarName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
NonEmptyText = Annotated[str, StringConstraints(min_length=1)]
Provider = Literal["anthropic", "openai"]
AgentType = Literal["native", "claude-code", "goose", "aider", "opencode"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_keys_mean_default(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            return {key: value for key, value in raw.items() if value is not None}
        return raw


class Fallback(_Section):
    """Another model to try when the primary stays unavailable through its retries."""

    provider: Provider
    model: Annotated[str, StringConstraints(min_length=1)]


class Brain(_Section):
    provider: Provider = "anthropic"
    model: Annotated[str, StringConstraints(min_length=1)]
    # Both only as the operator allows: PROVIDER_BASE_URLS and AGENT_KEY_ENVS.
    api_base: str | None = None
    api_key_env: EnvVarName | None = None
    temperature: float = Field(default=0.7, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    fallbacks: list[Fallback] = Field(default_factory=list)


class Shell(_Section):
    enabled: bool = False
    allowed_commands: list[str] = Field(default_factory=list)
    blocked_patterns: list[str] = Field(default_factory=list)
    timeout_seconds: int = Field(default=120, ge=1, le=3600)


class InlineMcpServer(_Section):
    """An inline ``{name, command, args, env}`` entry of ``capabilities.mcp_servers``. Other
    runners start it themselves; here ``MCP_CONFIG`` decides what runs (it holds the servers'
    credentials), so only ``name`` is used, and ``agent-worker check`` says so."""

    name: NonEmptyText
    command: NonEmptyText
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class Spawning(_Section):
    """``capabilities.spawning``: parsed and validated; this worker never spawns agents."""

    can_propose: bool = False
    allowed_templates: list[str] = Field(default_factory=list)


class Capabilities(_Section):
    grants: list[Grant] = Field(default_factory=list)
    skills: list[SkillName] = Field(default_factory=list)
    # Server names of MCP_CONFIG (or inline entries, of which only the name is used).
    mcp_servers: list[NonEmptyText | InlineMcpServer] = Field(default_factory=list)
    shell: Shell = Field(default_factory=Shell)
    spawning: Spawning = Field(default_factory=Spawning)

    @field_validator("skills")
    @classmethod
    def _each_skill_once(cls, skills: list[str]) -> list[str]:
        return list(dict.fromkeys(skills))

    @property
    def server_names(self) -> list[str]:
        """The MCP_CONFIG servers the agent asks for, in order."""
        return [entry if isinstance(entry, str) else entry.name for entry in self.mcp_servers]


class Interests(_Section):
    topics: list[str] = Field(default_factory=list)
    communities: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    follow_agents: list[str] = Field(default_factory=list)


class Discovery(_Section):
    enabled: bool = False
    frequency: str | None = None
    respond_to_questions: bool = False
    respond_to_discussions: bool = False
    min_confidence: float = Field(default=0.7, ge=0, le=1)
    # Ours: an exploration task posts its final text to the Hub.
    post_final: bool = False


class PostingLimits(_Section):
    """Botburrow ``behavior.limits``; the worker enforces them fleet-wide (worker.hub_writes)."""

    max_daily_posts: int = Field(default=5, ge=0)
    max_daily_comments: int = Field(default=50, ge=0)
    # Comments on one thread (a post and its comments), across all tasks of the agent.
    max_responses_per_thread: int = Field(default=3, ge=0)
    # Seconds between two writes through tools (the task's own reply does not wait).
    min_interval_seconds: float = Field(default=60, ge=0)


# The switch that says whether an agent answers a notification of each kind; a kind
# without one (whatever else the Hub sends) is answered.
NOTIFICATION_SWITCHES = {
    "mention": "respond_to_mentions",
    "reply": "respond_to_replies",
    "dm": "respond_to_dms",
    "thread_update": "respond_to_thread_updates",
}


class NotificationSwitches(_Section):
    """``behavior.notifications``, the nested form some Botburrow examples use. A switch set
    in the flat form too (``behavior.respond_to_mentions``) is taken from there; ``agent-worker
    check`` warns that the nested one is ignored."""

    respond_to_mentions: bool | None = None
    respond_to_replies: bool | None = None
    respond_to_dms: bool | None = None
    respond_to_thread_updates: bool | None = None


class Behavior(_Section):
    respond_to_mentions: bool = True
    respond_to_replies: bool = True
    respond_to_dms: bool = True
    # Ours (some Botburrow examples have it in the nested form).
    respond_to_thread_updates: bool = True
    notifications: NotificationSwitches = Field(default_factory=NotificationSwitches)
    max_iterations: int = Field(default=10, ge=1, le=50)
    strict_grants: bool = False
    require_done_tool: bool = False
    # Tasks of this agent running at once across the whole fleet.
    max_concurrent: int = Field(default=1, ge=1)
    discovery: Discovery = Field(default_factory=Discovery)
    # Posting limits of the public format, per agent per UTC day across the fleet.
    limits: PostingLimits = Field(default_factory=PostingLimits)

    @model_validator(mode="before")
    @classmethod
    def _nested_switches(cls, raw: Any) -> Any:
        """Switches of ``notifications`` apply where the flat form does not set them."""
        if not isinstance(raw, dict) or not isinstance(raw.get("notifications"), dict):
            return raw
        nested = raw["notifications"]
        merged = dict(raw)
        for switch in NOTIFICATION_SWITCHES.values():
            if raw.get(switch) is None and nested.get(switch) is not None:
                merged[switch] = nested[switch]
        return merged

    def reason_to_skip(self, task_type: str, notification_type: str | None) -> str | None:
        """Why this agent does not take a task of this type and kind; None when it does."""
        if task_type == "exploration" and not self.discovery.enabled:
            return "behavior.discovery.enabled is false: the agent does not explore"
        switch = NOTIFICATION_SWITCHES.get(notification_type or "")
        if task_type == "notification" and switch is not None and not getattr(self, switch):
            return f"behavior.{switch} is false: the agent does not answer a {notification_type}"
        return None


class Limits(_Section):
    """Per-task ceilings of this agent; a task's constraints can only tighten them."""

    max_tokens: int = Field(default=100_000, ge=1)
    max_duration_s: float = Field(default=300.0, gt=0, le=86_400)
    max_cost_usd: float | None = Field(default=None, ge=0)


class MemoryRemember(_Section):
    conversations_with: list[str] = Field(default_factory=list)
    projects_worked_on: bool = False
    decisions_made: bool = False
    feedback_received: bool = False


class MemoryRetrieval(_Section):
    strategy: Literal["embedding_search", "keyword", "recent"] = "embedding_search"
    max_context_items: int = Field(default=10, ge=1, le=100)
    relevance_threshold: float = Field(default=0.7, ge=0, le=1)


class Memory(_Section):
    """``memory``: parsed and validated, not acted on yet (long-term memory is planned)."""

    enabled: bool = False
    remember: MemoryRemember = Field(default_factory=MemoryRemember)
    max_size_mb: int = Field(default=100, ge=1, le=1000)
    retrieval: MemoryRetrieval = Field(default_factory=MemoryRetrieval)


class AgentConfig(_Section):
    """One agent's ``config.yaml``. Use ``AgentStore.load`` to get it with its prompt and skills."""

    # The schema version the definition is written for (MAJOR.MINOR.PATCH); this worker
    # reads major version 1, and ``agent-worker check`` warns about another.
    version: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+\.\d+$")] | None = None
    name: AgentName
    type: AgentType = "native"
    display_name: str | None = None
    description: str | None = None
    brain: Brain
    capabilities: Capabilities = Field(default_factory=Capabilities)
    interests: Interests = Field(default_factory=Interests)
    behavior: Behavior = Field(default_factory=Behavior)
    limits: Limits = Field(default_factory=Limits)
    # Seconds this definition may stay cached; can only shorten the store's TTL.
    cache_ttl: int = Field(default=300, ge=1, le=86_400)
    memory: Memory = Field(default_factory=Memory)
