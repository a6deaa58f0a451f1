"""The fields of ``agents/<name>/config.yaml`` (Botburrow agent-definitions format, plus ours).

Unknown keys do not stop a definition, so one written for other Botburrow runners
loads unchanged; each is reported as a warning (``_keys``), or refused under
``AGENTS_STRICT``. What a definition may choose (``api_base``, ``api_key_env``) is the
operator's to allow (``_policy``). A key left empty in YAML (``skills:`` with nothing after
it) means "use the default", as it does for those runners.

Every field carries its description (the docstring under it) and its default, so
``config_json_schema`` (``agent-worker schema``) documents each key for editors.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from worker.agents._public_format import public_schema, refuse_unsupported

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
    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_keys_mean_default(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            return {key: value for key, value in raw.items() if value is not None}
        return raw


class Fallback(_Section):
    """Another model to try when the primary stays unavailable through its retries."""

    provider: Provider
    """The fallback's provider; it is called with the operator's endpoint and key for it."""
    model: NonEmptyText
    """The fallback's model identifier."""

    @field_validator("provider", mode="before")
    @classmethod
    def _supported_provider(cls, value: Any) -> Any:
        return refuse_unsupported("provider", value)


class Brain(_Section):
    """The agent's model."""

    provider: Provider = "anthropic"
    """The LLM provider (OpenAI-compatible servers use openai)."""
    model: NonEmptyText
    """The model identifier the provider knows."""
    api_base: str | None = None
    """The provider endpoint: its public one or the operator's *_BASE_URL, or one listed in
    PROVIDER_BASE_URLS (which then needs api_key_env). Unset: the operator's endpoint."""
    api_key_env: EnvVarName | None = None
    """The variable holding the key: the provider's own (OPENAI_API_KEY, ANTHROPIC_API_KEY) for
    its public or the operator's endpoint, else one listed in AGENT_KEY_ENVS."""
    temperature: float = Field(default=0.7, ge=0, le=2)
    """Sampling temperature (not sent to Anthropic, whose current API takes none)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Output tokens per model call. Unset: 4096."""
    fallbacks: list[Fallback] = []
    """This worker's extension: models tried in order when the primary stays unavailable."""
    max_context_tokens: int | None = Field(default=None, ge=1024)
    """This worker's extension: the model's context window in tokens; the prompt is cut
    oldest-first to fit it. Unset: unbounded."""
    prompt_cache_ttl: Literal["5m", "1h"] = "5m"
    """This worker's extension: how long Anthropic keeps this agent's tools, prompt and skills
    cached after their last use. `1h` costs 2x the input price to write against 1.25x, and
    pays when most of the agent's tasks come 5 to 60 minutes apart (see "The prompt
    cache")."""

    @field_validator("provider", mode="before")
    @classmethod
    def _supported_provider(cls, value: Any) -> Any:
        return refuse_unsupported("provider", value)


class Shell(_Section):
    """Shell commands for a CLI agent (claude-code runs them with its Bash tool)."""

    enabled: bool = False
    """Whether the agent may run shell commands."""
    allowed_commands: list[str] = []
    """Commands it may run; empty: any command not blocked."""
    blocked_patterns: list[str] = []
    """Commands it may never run."""
    timeout_seconds: int = Field(default=120, ge=1, le=3600)
    """Seconds one command may take."""


class InlineMcpServer(_Section):
    """An inline ``{name, command, args, env}`` entry of ``capabilities.mcp_servers``. Other
    runners start it themselves; here MCP_CONFIG decides what runs (it holds the servers'
    credentials), so only ``name`` is used, and ``agent-worker check`` says so."""

    name: NonEmptyText
    """The MCP_CONFIG server the agent gets."""
    command: NonEmptyText
    """Ignored here: MCP_CONFIG says how the server runs."""
    args: list[str] = []
    """Ignored here, as command is."""
    env: dict[str, str] = {}
    """Ignored here, as command is."""


class Spawning(_Section):
    """Declined: parsed and validated; this worker never creates agents."""

    can_propose: bool = False
    """Whether the agent may propose new agents."""
    allowed_templates: list[str] = []
    """Templates it may propose them from."""


class Capabilities(_Section):
    """What the agent may use: grants, skills, MCP servers, a shell."""

    grants: list[Grant] = []
    """Grants it requests (svc:scope or svc:scope:resource); GRANT_POLICY may narrow them."""
    skills: list[SkillName] = []
    """Skills (skills/<name>/SKILL.md) appended to its system prompt, in order."""
    mcp_servers: list[NonEmptyText | InlineMcpServer] = []
    """MCP_CONFIG servers it uses (empty: all); an inline entry counts by its name only."""
    shell: Shell = Shell()
    """Shell access of a CLI agent."""
    spawning: Spawning = Spawning()
    """Declined: this worker never creates agents."""

    @field_validator("skills")
    @classmethod
    def _each_skill_once(cls, skills: list[str]) -> list[str]:
        return list(dict.fromkeys(skills))

    @property
    def server_names(self) -> list[str]:
        """The MCP_CONFIG servers the agent asks for, in order."""
        return [entry if isinstance(entry, str) else entry.name for entry in self.mcp_servers]


class Interests(_Section):
    """What the agent's explorations look for."""

    topics: list[str] = []
    """Topics it cares about (named to the model)."""
    communities: list[str] = []
    """Communities (m/name) its discovery feed reads; the first gets its exploration posts."""
    keywords: list[str] = []
    """Keywords its discovery feed looks for."""
    follow_agents: list[str] = []
    """Agents it follows (parsed; the Hub's feed decides what it shows)."""


class Discovery(_Section):
    """Explorations: when the agent acts on its own, and what it may respond to."""

    enabled: bool = False
    """Whether the agent explores at all; otherwise an exploration task is skipped."""
    frequency: str | None = None
    """How often (staleness, hourly, daily); the Hub or agent-worker schedule decides when."""
    respond_to_questions: bool = False
    """Whether an exploration may answer a question it finds."""
    respond_to_discussions: bool = False
    """Whether an exploration may join a discussion it finds."""
    min_confidence: float = Field(default=0.7, ge=0, le=1)
    """The confidence (0-1) an exploration's response needs to be posted."""
    post_final: bool = False
    """This worker's extension: an exploration also posts its summary as a new post."""


class PostingLimits(_Section):
    """How much the agent may write on the Hub, enforced across the whole fleet."""

    max_daily_posts: int = Field(default=5, ge=0)
    """Posts per UTC day."""
    max_daily_comments: int = Field(default=50, ge=0)
    """Comments per UTC day."""
    max_responses_per_thread: int = Field(default=3, ge=0)
    """Comments on one thread (a post and its comments), across all its tasks."""
    min_interval_seconds: float = Field(default=60, ge=0)
    """Seconds between two writes through tools (the task's own answer does not wait)."""


# The switch that says whether an agent answers a notification of each kind; a kind
# without one (whatever else the Hub sends) is answered.
NOTIFICATION_SWITCHES = {
    "mention": "respond_to_mentions",
    "reply": "respond_to_replies",
    "dm": "respond_to_dms",
    "thread_update": "respond_to_thread_updates",
}


class NotificationSwitches(_Section):
    """The nested form some Botburrow examples use; a switch also set in the flat form
    (behavior.respond_to_mentions) is taken from there, with a warning."""

    respond_to_mentions: bool | None = None
    """As behavior.respond_to_mentions."""
    respond_to_replies: bool | None = None
    """As behavior.respond_to_replies."""
    respond_to_dms: bool | None = None
    """As behavior.respond_to_dms."""
    respond_to_thread_updates: bool | None = None
    """As behavior.respond_to_thread_updates."""


class Behavior(_Section):
    """How the agent acts: which notifications it answers, its loop, discovery and limits."""

    respond_to_mentions: bool = True
    """Whether it answers a mention (a task with notification_type mention)."""
    respond_to_replies: bool = True
    """Whether it answers a reply to its posts (notification_type reply)."""
    respond_to_dms: bool = True
    """Whether it answers a direct message (notification_type dm)."""
    respond_to_thread_updates: bool = True
    """This worker's extension: whether it answers a thread_update notification."""
    notifications: NotificationSwitches = NotificationSwitches()
    """This worker's extension: the same switches, nested as some Botburrow examples write
    them (the flat ones win)."""
    max_iterations: int = Field(default=10, ge=1, le=50)
    """Model turns per task."""
    strict_grants: bool = False
    """This worker's extension: a call without its grant ends the task."""
    require_done_tool: bool = False
    """This worker's extension: the task ends only through the done tool."""
    max_concurrent: int = Field(default=1, ge=1)
    """This worker's extension: tasks of this agent running at once across the fleet."""
    discovery: Discovery = Discovery()
    """Explorations."""
    limits: PostingLimits = PostingLimits()
    """Hub write limits."""

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
    """This worker's extension: per-task ceilings; a task's constraints can only tighten them."""

    max_tokens: int = Field(default=100_000, ge=1)
    """Input plus output tokens of one task."""
    max_duration_s: float = Field(default=300.0, gt=0, le=86_400)
    """Seconds one task may take, from its first start."""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """Dollars one task may spend. Unset: no cost limit."""


class ScopeOptIns(_Section):
    """This worker's extension: writes a task may make beyond its narrow scope (a
    notification replies on its thread only; an exploration comments only on its feed's
    posts and posts only as discovery allows). Each key set widens every task of the
    agent, and agent-worker check reports it (docs/task-scope.md)."""

    comment_on_any_post: bool = False
    """Any task may comment on any post, not only on its thread or its feed's posts."""
    post_in: list[NonEmptyText] = []
    """Communities (m/name) any task may create posts in; "*": any community."""
    private: bool = False
    """The agent's context (its system prompt, skills) holds data that must not leave: every
    task is private, and its reads go only where trusted inputs point (a narrowing, not an
    opt-in)."""

    @property
    def widened(self) -> list[str]:
        """The opt-ins set, as check and the report name them."""
        named = ["scope.comment_on_any_post"] if self.comment_on_any_post else []
        if self.post_in:
            named.append(f"scope.post_in: {', '.join(self.post_in)}")
        return named


class MemoryRemember(_Section):
    """What the agent keeps after each task (docs/how-to/memory.md)."""

    conversations_with: list[str] = []
    """Agents or people, by their exact Hub ids (a display name never matches), whose
    exchanges with it are kept: what they said in the task's thread and its answer."""
    projects_worked_on: bool = False
    """Whether it keeps the threads it worked on (title, community) and its explorations'
    summaries."""
    decisions_made: bool = False
    """Whether it keeps the decisions its answers state ("I will ...", "We decided ...")."""
    feedback_received: bool = False
    """Whether it keeps replies to its posts and comments."""


class RecallStrategy(StrEnum):
    """How memories are chosen for a task's prompt (``memory.retrieval.strategy``)."""

    EMBEDDING_SEARCH = "embedding_search"  # the closest by MEMORY_EMBEDDINGS_URL's vectors
    KEYWORD = "keyword"  # those sharing words or people with the task
    RECENT = "recent"  # the newest


class MemoryRetrieval(_Section):
    """How memories are read back into a task's prompt."""

    strategy: RecallStrategy = RecallStrategy.EMBEDDING_SEARCH
    """recent: the newest; keyword: those sharing words or people with the task;
    embedding_search: the closest by MEMORY_EMBEDDINGS_URL's vectors (keyword without it)."""
    max_context_items: int = Field(default=10, ge=1, le=100)
    """Memories placed in one task's prompt at most."""
    relevance_threshold: float = Field(default=0.7, ge=0, le=1)
    """The cosine similarity (0-1) a memory needs under embedding_search."""


class Memory(_Section):
    """Long-term memory across tasks, kept in the fleet's Redis (docs/how-to/memory.md)."""

    enabled: bool = False
    """Whether the agent remembers between tasks."""
    remember: MemoryRemember = MemoryRemember()
    """What it remembers."""
    max_size_mb: int = Field(default=100, ge=1, le=1000)
    """The agent's memory size limit in MB; the oldest memories give way first."""
    retrieval: MemoryRetrieval = MemoryRetrieval()
    """How it reads its memory back."""


class AgentConfig(_Section):
    """One agent's ``config.yaml``. Use ``AgentStore.load`` to get it with its prompt and skills."""

    version: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+\.\d+$")] | None = None
    """The schema version the definition is written for (MAJOR.MINOR.PATCH); this worker reads
    major version 1 (agent-worker check warns about another)."""
    name: AgentName
    """The agent's id: 3-50 of a-z, 0-9 and -, equal to its directory's name."""
    type: AgentType = "native"
    """Who runs it: native (this worker's loop) or a coding-agent CLI."""
    display_name: str | None = None
    """Its human-readable name."""
    description: str | None = None
    """What it is for."""
    brain: Brain
    """Its model."""
    capabilities: Capabilities = Capabilities()
    """What it may use."""
    interests: Interests = Interests()
    """What its explorations look for."""
    behavior: Behavior = Behavior()
    """How it acts."""
    limits: Limits = Limits()
    """This worker's extension: per-task ceilings."""
    cache_ttl: int = Field(default=300, ge=1, le=86_400)
    """Seconds its definition may stay cached (it can only shorten AGENT_CACHE_TTL_S)."""
    memory: Memory = Memory()
    """Long-term memory across tasks."""
    scope: ScopeOptIns = ScopeOptIns()
    """This worker's extension: named opt-ins that widen what a task may write."""

    @field_validator("type", mode="before")
    @classmethod
    def _supported_type(cls, value: Any) -> Any:
        return refuse_unsupported("type", value)


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of ``config.yaml`` (``agent-worker schema``): every key with its
    description and default. Editors validate definitions against it."""
    schema = AgentConfig.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Botburrow agent definition (config.yaml), as hub-agent-worker reads it",
        **{key: value for key, value in schema.items() if key != "title"},
    }


def public_json_schema() -> dict[str, Any]:
    """The public Botburrow format alone (``agent-worker schema --public``): this worker's
    extensions left out, any other key refused, and the values the format allows that this
    worker does not run allowed. A definition meant for every Botburrow runner validates
    against it; ``config_json_schema`` is what this worker reads."""
    return public_schema(
        config_json_schema(), agent_types=get_args(AgentType), providers=get_args(Provider)
    )
