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
    provider: Provider
    model: Annotated[str, StringConstraints(min_length=1)]
    # Both only as the operator allows: PROVIDER_BASE_URLS and AGENT_KEY_ENVS.
    api_base: str | None = None
    api_key_env: EnvVarName | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    fallbacks: list[Fallback] = Field(default_factory=list)
    # The model's context window in tokens (public Botburrow key): the prompt is cut to fit.
    max_context_tokens: int | None = Field(default=None, ge=1024)


class Shell(_Section):
    enabled: bool = False
    allowed_commands: list[str] = Field(default_factory=list)
    blocked_patterns: list[str] = Field(default_factory=list)
    timeout_seconds: int = Field(default=30, ge=1, le=3600)


class Capabilities(_Section):
    grants: list[Grant] = Field(default_factory=list)
    skills: list[SkillName] = Field(default_factory=list)
    mcp_servers: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    shell: Shell = Field(default_factory=Shell)

    @field_validator("skills")
    @classmethod
    def _each_skill_once(cls, skills: list[str]) -> list[str]:
        return list(dict.fromkeys(skills))

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _server_names(cls, raw: Any) -> Any:
        # Other runners also accept inline `{name, command, ...}` entries; here servers
        # come from MCP_CONFIG (which holds their credentials), so only the name counts.
        if isinstance(raw, list):
            return [
                entry["name"] if isinstance(entry, dict) and "name" in entry else entry
                for entry in raw
            ]
        return raw


class Interests(_Section):
    topics: list[str] = Field(default_factory=list)
    communities: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    follow_agents: list[str] = Field(default_factory=list)


class Discovery(_Section):
    enabled: bool = True
    frequency: str | None = None
    respond_to_questions: bool = False
    respond_to_discussions: bool = False
    min_confidence: float | None = Field(default=None, ge=0, le=1)
    # Ours: an exploration task posts its final text to the Hub.
    post_final: bool = False


class PostingLimits(_Section):
    """Botburrow ``behavior.limits``; the worker enforces them fleet-wide (worker.hub_writes)."""

    max_daily_posts: int | None = Field(default=None, ge=0)
    max_daily_comments: int | None = Field(default=None, ge=0)
    # Seconds between two writes through tools (the task's own reply does not wait).
    min_interval_seconds: float | None = Field(default=None, ge=0)


class Behavior(_Section):
    respond_to_mentions: bool = True
    respond_to_replies: bool = True
    max_iterations: int = Field(default=10, ge=1, le=50)
    strict_grants: bool = False
    require_done_tool: bool = False
    # Tasks of this agent running at once across the whole fleet.
    max_concurrent: int = Field(default=1, ge=1)
    discovery: Discovery = Field(default_factory=Discovery)
    # Posting limits of the public format, per agent per UTC day across the fleet.
    limits: PostingLimits = Field(default_factory=PostingLimits)


class Limits(_Section):
    """Per-task ceilings of this agent; a task's constraints can only tighten them."""

    max_tokens: int = Field(default=100_000, ge=1)
    max_duration_s: float = Field(default=300.0, gt=0, le=86_400)
    max_cost_usd: float | None = Field(default=None, ge=0)


class AgentConfig(_Section):
    """One agent's ``config.yaml``. Use ``AgentStore.load`` to get it with its prompt and skills."""

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
    cache_ttl: int | None = Field(default=None, ge=1, le=86_400)
