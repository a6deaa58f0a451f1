"""All configuration, from environment variables (docs/reference/settings.md lists them)."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.exceptions import ConfigurationError

# HS256 wants a key at least as long as its hash (RFC 7518 section 3.2).
MIN_KEY_LENGTH = 32


def key_too_short(length: int) -> str:
    """What a CAPABILITY_KEY of ``length`` characters lacks, and how to make a good one."""
    return (
        f"must be at least {MIN_KEY_LENGTH} characters (got {length}); generate one with: "
        "openssl rand -hex 32"
    )


class Settings(BaseSettings):
    """Every setting of the worker, its MCP servers and ``agent-worker``.

    Each field is the variable of its name in upper case; the docstring under it is its
    meaning, which the documentation's settings reference prints (a test requires one).
    """

    model_config = SettingsConfigDict(
        env_prefix="", case_sensitive=False, extra="ignore", use_attribute_docstrings=True
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    """The Redis of the fleet (rq also reads `RQ_REDIS_URL`: leave it unset and start workers
    with `RQ_CONFIG=worker.rq_config`). With `REDIS_SENTINELS`, only its password, database
    and TLS (`rediss://`) are used."""
    redis_sentinels: str | None = None
    """Redis Sentinel instead: `host:port,host:port`. The fleet's Redis is the primary they
    name, found again after a failover (see "Run on Redis Sentinel")."""
    redis_sentinel_master: str = Field(default="mymaster", min_length=1)
    """The name the sentinels monitor the primary under."""
    redis_sentinel_password: SecretStr | None = None
    """Password of the sentinels themselves, when they require one."""
    hub_url: str = "http://127.0.0.1:8100"
    """The Hub; calls go to `${HUB_URL}/api/v1`."""
    hub_api_key: SecretStr | None = None
    """Bearer for the Hub (the worker posts results; mcp-hub needs it too)."""
    agents_dir: str = "."
    """Root of the definitions tree (`agents/<name>/config.yaml`, `skills/<skill>/SKILL.md`): a
    directory, or an `http(s)://` base URL serving the same layout (R2, Git raw). The default
    is a checkout of an agent-definitions repository as the working directory."""
    mcp_config: Path | None = None
    """YAML of MCP servers and the grant each tool requires; unset, agents have no tools."""
    grant_policy: Path | None = None
    """Operator YAML capping the grants and scope opt-ins a definition may claim."""
    strict_grants: bool = False
    """A tool call without its grant ends the task (`autonomy_violation`)."""
    metrics_port: int = Field(default=9108, ge=0, le=65535)
    """Port of `/metrics` and `/healthz`; when taken, the next free port up to +16 (logged);
    `0` disables them."""
    metrics_host: str = Field(default="0.0.0.0", min_length=1)
    """Address `/metrics` and `/healthz` bind: every interface, so Prometheus on another host
    can scrape; `127.0.0.1` keeps them on the host."""
    metrics_textfile: Path | None = None
    """Write the metrics there when the worker exits (burst or cron workers)."""
    prices_file: Path | None = None
    """YAML of per-model prices merged over the built-in table."""
    errors_agent_id: str = "agent-worker"
    """Who posts to `m/agent-errors` when the task's agent is unknown."""
    mcp_auth_token: SecretStr | None = None
    """Bearer our MCP servers require over HTTP; the worker sends it only to servers marked
    `first_party: true` in `MCP_CONFIG`."""
    capability_key: SecretStr | None = None
    """At least 32 characters, shared only by the workers and our MCP servers: signs each
    task's capability, without which our servers act for no agent. Unset: development mode."""

    anthropic_api_key: SecretStr | None = None
    """Key of the Anthropic provider."""
    anthropic_base_url: str | None = None
    """Endpoint of the Anthropic provider (the SDK's default when unset)."""
    openai_api_key: SecretStr | None = None
    """Key of the OpenAI provider, or of any compatible endpoint."""
    openai_base_url: str | None = None
    """Endpoint of the OpenAI provider: any compatible server (vLLM, Ollama, LiteLLM,
    llama.cpp's `llama-server`)."""
    prompt_cache: Literal["on", "off"] = "on"
    """`on`: each model call asks its provider's prompt cache to keep what repeats (Anthropic's
    `cache_control` breakpoints, OpenAI's `prompt_cache_key`; see "The prompt cache").
    `off`: requests carry neither, the system prompt goes as one text."""
    openai_prompt_cache_routing: bool = True
    """Send `prompt_cache_key` to OpenAI-compatible endpoints. A server that answers 400 naming
    the field is asked again without it, and not sent it again by this process."""

    agent_cache_ttl_s: int = Field(default=300, ge=0)
    """Seconds parsed agent definitions stay cached in Redis."""
    result_ttl_s: int = Field(default=7 * 86_400, ge=60)
    """Seconds rq keeps finished jobs and their reports (7 days)."""
    job_timeout_grace_s: int = Field(default=60, ge=5)
    """Seconds added to a task's deadline (its time left, on a re-run) for rq's hard timeout."""
    worker_concurrency: int = Field(default=1, ge=1, le=1000)
    """Tasks one worker process runs at once. `1` is rq's way: a forked job process per task.
    Above 1, up to that many tasks run in threads of the worker process itself (about 0.4 MB
    per task in flight), each in its own event loop; a crash of the process re-runs all of
    its tasks from their checkpoints."""
    pool_processes: int = Field(default=0, ge=0, le=256)
    """Worker processes `agent-worker pool` forks (its `--processes`); `0`: one per CPU core."""
    pool_concurrency: int = Field(default=50, ge=2, le=1000)
    """Tasks each of the pool's workers runs at once, in threads (its `--concurrency`)."""
    tool_output_max_chars: int = Field(default=20_000, ge=200)
    """Longer tool outputs are truncated with a marker."""
    context_budget_chars: int = Field(default=200_000, ge=1_000)
    """Older tool outputs beyond this many characters are replaced by a stub."""
    max_same_call_repeats: int = Field(default=3, ge=1)
    """The same tool with the same arguments more often closes the run with a tool-less turn
    (`tool_loop` if it gives no answer)."""
    max_consecutive_error_steps: int = Field(default=3, ge=1)
    """That many steps in a row whose tool calls all failed close the run the same way."""
    llm_max_retries: int = Field(default=4, ge=0, le=20)
    """Retries of a model call on 408, 409, 429, 5xx but 501 and 505, and connection errors,
    with backoff honouring `Retry-After` (see "What an HTTP status does")."""
    llm_timeout_s: float = Field(default=120.0, gt=0)
    """Cap of one model call; the task's remaining time caps it too."""
    hub_timeout_s: float = Field(default=15.0, gt=0)
    """Cap of one Hub call; the task's remaining time caps it too."""
    mcp_timeout_s: float = Field(default=60.0, gt=0)
    """Cap of one MCP call; the task's remaining time caps it too."""
    mcp_result_max_bytes: int = Field(default=4_000_000, ge=10_000)
    """Bytes read from an MCP server for one tool result (HTTP response or stdio message); a
    larger answer is not read and the model gets an error naming the tool."""
    requeue_max_attempts: int = Field(default=5, ge=0)
    """Times a task is put back when the provider stays unavailable."""
    requeue_delay_s: float = Field(default=30.0, ge=0)
    """First delay before such a task runs again (doubles each time, at least `Retry-After`)."""
    llm_requests_per_minute: int = Field(default=0, ge=0)
    """Fleet-wide model requests per minute, per provider and model, shared through Redis
    (`0`: no limit)."""
    llm_tokens_per_minute: int = Field(default=0, ge=0)
    """Fleet-wide model tokens per minute, per provider and model, shared through Redis
    (`0`: no limit)."""
    busy_wait_s: float = Field(default=10.0, ge=0)
    """How long a task waits for its agent's free slot (or its own lease) before it is put
    back."""
    busy_requeue_delay_s: float = Field(default=15.0, ge=1)
    """The delay before a task put back for a busy agent runs again."""
    redis_patience_s: float = Field(default=33.0, ge=0.5, le=3600)
    """How long one Redis command of a worker, job or scheduler waits out an outage or a
    refused write (restart, failover, `OOM`, `READONLY`, `LOADING`) before it fails; an idle
    worker asked to stop does not wait."""
    heartbeat_grace_s: int = Field(default=60, ge=5)
    """How long past its next expected heartbeat a task counts as abandoned (its worker died),
    so that rq's maintenance re-runs it elsewhere; rq's own is a fixed 60 s."""
    job_data_max_bytes: int = Field(default=4_194_304, ge=65_536)
    """What a job hash's `data` (and stored exception text) may decompress to; a bigger one
    (a zlib bomb) fails unread as undecodable."""
    outbox_max_attempts: int = Field(default=30, ge=1)
    """Delivery attempts of one outbox item (about 2 h of backoff) before it becomes a dead
    letter."""
    max_writes_per_post: int = Field(default=1, ge=0)
    """Comments one task may make on one post (`0`: no limit)."""
    hub_tool_server: str = "hub"
    """The `MCP_CONFIG` server that is `mcp_servers.hub`; its `create_post` and
    `create_comment` count against the write caps."""
    web_tool_server: str = "web"
    """The `MCP_CONFIG` server that is `mcp_servers.web`; in a private task its `fetch` may
    load only the URLs trusted inputs point to (docs/task-scope.md)."""
    egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Where a private task may fetch besides the links its person gave (comma-separated or a
    JSON list): a host name (that host exactly, any path) or an http(s) URL prefix (that
    origin, that path and below)."""
    private_agents: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Agents whose every task is private (comma-separated or a JSON list; `*`: all), as
    `scope.private: true` in a definition marks its own: their context holds data that
    must not leave."""
    unmarked_posts: Literal["private", "public"] = "private"
    """What a notified post counts as when the Hub's answer says nothing of its `visibility`:
    `private` (fail closed: its task is private, its memories keep to its author) or
    `public` (a Hub that has no direct messages, or labels each `dm`)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The least severe log lines written: `DEBUG`, `INFO`, `WARNING` or `ERROR`."""
    provider_base_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Endpoints a definition may name as `brain.api_base`: comma-separated or a JSON list,
    matched exactly after normalising (scheme and host lower-cased, default port and trailing
    `/` dropped)."""
    agent_key_envs: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Variables a definition may name as `brain.api_key_env` (comma-separated or a JSON
    list); the worker's own secrets cannot be listed."""
    agents_strict: bool = False
    """An unknown key in a `config.yaml` fails the definition instead of logging a warning."""
    budget_unreachable: Literal["run", "refuse"] = "run"
    """When the Hub's budget endpoint does not answer: `run` the task anyway (logged
    `budget_check_skipped`), or `refuse` it, putting it back with a delay like a Hub outage
    (`requeued`, up to `REQUEUE_MAX_ATTEMPTS`). Both count
    `agent_budget_check_unreachable_total{agent}`."""
    can_execute_tool: str | None = None
    """`package.module:function` asked before every tool call, in the native loop and in the
    CLI gateway: `None` or `True` allows, a string refuses with that reason. Imported once at
    start; a bad path stops start-up naming the variable."""
    cli_sandbox: Literal["on", "off"] = "on"
    """`on`: every coding-agent CLI runs in the bubblewrap sandbox, and a CLI task fails when
    the host cannot provide it; `off`: CLIs run unconfined, with a warning at every start and
    every CLI task."""
    cli_sandbox_memory_mb: int = Field(default=4096, ge=64)
    """Data memory of each process in a CLI's sandbox (`RLIMIT_DATA`)."""
    cli_sandbox_max_processes: int = Field(default=256, ge=8)
    """Processes of the sandbox's user (`RLIMIT_NPROC`)."""
    cli_sandbox_max_file_mb: int = Field(default=1024, ge=1)
    """The largest file a CLI may write (`RLIMIT_FSIZE`)."""
    cli_sandbox_workspace_mb: int = Field(default=1024, ge=16)
    """Size of the sandbox's workspace, a tmpfs (see "CLI sandbox bounds")."""
    cli_sandbox_tmp_mb: int = Field(default=256, ge=16)
    """Size of the sandbox's `/tmp` and of its `/dev/shm`, each a tmpfs."""
    cli_sandbox_uid: int = Field(default=65534, ge=1)
    """The host user a sandbox runs as when the worker runs as root (a non-root worker's
    sandbox runs as its own uid, in a user namespace)."""
    cli_sandbox_read_only: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """More host paths a CLI needs read-only in its sandbox (comma-separated or a JSON list
    of absolute paths), e.g. a CLI installed outside `/usr`."""
    memory_embeddings_url: str | None = None
    """OpenAI-compatible base URL (`POST {url}/embeddings`: llama.cpp's `llama-server
    --embeddings`, vLLM, Ollama, OpenAI) for agents whose `memory.retrieval.strategy` is
    `embedding_search`; unset, they search their memory by keyword, with a warning at start
    and from `agent-worker check`."""
    memory_embeddings_model: str = Field(default="text-embedding-3-small", min_length=1)
    """The model name sent to `MEMORY_EMBEDDINGS_URL`."""
    memory_embeddings_api_key: SecretStr | None = None
    """Bearer sent only to `MEMORY_EMBEDDINGS_URL`."""
    memory_embeddings_timeout_s: float = Field(default=10.0, gt=0)
    """Cap of one embeddings call (the task's remaining time caps it too)."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("can_execute_tool")
    @classmethod
    def _tool_check(cls, value: str | None) -> str | None:
        from worker._hooks import load_can_execute_tool

        if value is None or not value.strip():
            return None
        load_can_execute_tool(value.strip())
        return value.strip()

    @field_validator("capability_key")
    @classmethod
    def _long_enough_to_sign(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and len(key.get_secret_value()) < MIN_KEY_LENGTH:
            raise ValueError(key_too_short(len(key.get_secret_value())))
        return key

    @field_validator("egress_allow", mode="before")
    @classmethod
    def _egress_allow(cls, value: object) -> object:
        from worker._network import check_allow_entry, split_list_setting

        entries = split_list_setting(value, "EGRESS_ALLOW")
        return [check_allow_entry(e) for e in entries] if isinstance(entries, list) else entries

    @field_validator("private_agents", mode="before")
    @classmethod
    def _private_agents(cls, value: object) -> object:
        from worker._network import split_list_setting

        return split_list_setting(value, "PRIVATE_AGENTS")

    @field_validator("budget_unreachable", "cli_sandbox", "unmarked_posts", mode="before")
    @classmethod
    def _lower_choice(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("memory_embeddings_url")
    @classmethod
    def _optional_http_url(cls, url: str | None) -> str | None:
        if url is None or not url.strip():
            return None
        return _http_url(url.strip())

    @field_validator("hub_url")
    @classmethod
    def _hub_url(cls, url: str) -> str:
        return _http_url(url)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        # redis-py's own message comes with a traceback and without the variable's name.
        from worker._network import check_redis_url

        return check_redis_url(url)

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinel_addresses(cls, value: str | None) -> str | None:
        from worker._network import parse_sentinel_addresses

        if value is not None and value.strip():
            parse_sentinel_addresses(value)
            return value
        return None

    @field_validator("provider_base_urls", mode="before")
    @classmethod
    def _provider_base_urls(cls, value: object) -> object:
        from worker._network import base_url_allow_list, split_list_setting

        urls = split_list_setting(value, "PROVIDER_BASE_URLS")
        return base_url_allow_list(urls) if isinstance(urls, list) else urls

    @field_validator("cli_sandbox_read_only", mode="before")
    @classmethod
    def _read_only_paths(cls, value: object) -> object:
        from worker._network import split_list_setting

        paths = split_list_setting(value, "CLI_SANDBOX_READ_ONLY")
        if isinstance(paths, list) and not all(path.startswith("/") for path in paths):
            raise ValueError("CLI_SANDBOX_READ_ONLY takes absolute paths")
        return paths

    @field_validator("agent_key_envs", mode="before")
    @classmethod
    def _agent_key_envs(cls, value: object) -> object:
        from worker._network import (
            agent_key_allow_list,
            split_list_setting,
            worker_secret_variables,
        )

        names = split_list_setting(value, "AGENT_KEY_ENVS")
        if not isinstance(names, list):
            return names
        return agent_key_allow_list(names, worker_secret_variables(cls.model_fields))

    def secret_values(self) -> list[str]:
        """Every secret this process holds, for redaction."""
        secrets = [
            self.hub_api_key,
            self.mcp_auth_token,
            self.redis_sentinel_password,
            self.capability_key,
            self.anthropic_api_key,
            self.openai_api_key,
            self.memory_embeddings_api_key,
        ]
        return [s.get_secret_value() for s in secrets if s is not None and s.get_secret_value()]


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"must be an http(s) URL such as http://127.0.0.1:8100, got {url!r}")
    return url


def load_settings() -> Settings:
    """Read the environment; raise ConfigurationError naming the first bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        variable = str(error["loc"][0]).upper() if error["loc"] else "environment"
        message = error["msg"].removeprefix("Value error, ")
        raise ConfigurationError(f"invalid setting {variable}: {message}") from None


@lru_cache(maxsize=1)
def settings() -> Settings:
    return load_settings()


def settings_or_exit() -> Settings:
    """For entry points: one clear line on stderr and exit 2 instead of a traceback."""
    try:
        return settings()
    except ConfigurationError as exc:
        print(f"agent-worker: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None
