"""All configuration, from environment variables (the README's configuration table)."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.exceptions import ConfigurationError


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    # Redis Sentinel (host:port,host:port): the fleet's Redis is the primary they name;
    # REDIS_URL then gives only credentials, database and TLS (worker.redis_io._connection).
    redis_sentinels: str | None = None
    redis_sentinel_master: str = Field(default="mymaster", min_length=1)
    redis_sentinel_password: SecretStr | None = None
    hub_url: str = "http://127.0.0.1:8100"
    hub_api_key: SecretStr | None = None
    # The root of a definitions tree (agents/<name>/config.yaml, skills/<skill>/SKILL.md): a
    # directory, or an http(s) base URL serving the same layout (R2, Git raw). "." is a
    # checkout of an agent-definitions repository as the working directory.
    agents_dir: str = "."
    mcp_config: Path | None = None
    grant_policy: Path | None = None
    strict_grants: bool = False
    metrics_port: int = Field(default=9108, ge=0, le=65535)
    # Address /metrics and /healthz bind; all interfaces, as before, so Prometheus can scrape.
    metrics_host: str = Field(default="0.0.0.0", min_length=1)
    # When set, the worker writes its metrics there on exit (burst and cron workers).
    metrics_textfile: Path | None = None
    prices_file: Path | None = None
    errors_agent_id: str = "agent-worker"
    mcp_auth_token: SecretStr | None = None
    # Signs the per-task capability our MCP servers verify (shared by workers and servers).
    capability_key: SecretStr | None = Field(default=None, min_length=32)

    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None

    # Further settings (README configuration table).
    agent_cache_ttl_s: int = Field(default=300, ge=0)
    result_ttl_s: int = Field(default=7 * 86_400, ge=60)
    job_timeout_grace_s: int = Field(default=60, ge=5)
    # Tasks one worker process runs at once: 1 forks a job process per task (rq's way).
    worker_concurrency: int = Field(default=1, ge=1, le=1000)
    # agent-worker pool: worker processes (0: one per CPU core) and tasks at once in each.
    pool_processes: int = Field(default=0, ge=0, le=256)
    pool_concurrency: int = Field(default=50, ge=2, le=1000)
    tool_output_max_chars: int = Field(default=20_000, ge=200)
    context_budget_chars: int = Field(default=200_000, ge=1_000)
    max_same_call_repeats: int = Field(default=3, ge=1)
    max_consecutive_error_steps: int = Field(default=3, ge=1)
    llm_max_retries: int = Field(default=4, ge=0, le=20)
    llm_timeout_s: float = Field(default=120.0, gt=0)
    hub_timeout_s: float = Field(default=15.0, gt=0)
    mcp_timeout_s: float = Field(default=60.0, gt=0)
    # Bytes read from an MCP server for one tool result (HTTP response or stdio line).
    mcp_result_max_bytes: int = Field(default=4_000_000, ge=10_000)
    requeue_max_attempts: int = Field(default=5, ge=0)
    requeue_delay_s: float = Field(default=30.0, ge=0)
    # Fleet-wide model call limits per provider and model (0: none).
    llm_requests_per_minute: int = Field(default=0, ge=0)
    llm_tokens_per_minute: int = Field(default=0, ge=0)
    # How long a task waits for its agent's free slot (or its own lease) before requeueing.
    busy_wait_s: float = Field(default=10.0, ge=0)
    busy_requeue_delay_s: float = Field(default=15.0, ge=1)
    # How long one Redis command waits out an outage or a refused write before it fails.
    redis_patience_s: float = Field(default=33.0, ge=0.5, le=3600)
    # How long past its last expected heartbeat a task counts as abandoned (rq's fixed 60 s).
    heartbeat_grace_s: int = Field(default=60, ge=5)
    # Bytes a job hash's data may decompress to; a bigger one (a zlib bomb) fails unread.
    job_data_max_bytes: int = Field(default=4_194_304, ge=65_536)
    # Delivery attempts of one outbox item before it becomes a dead letter.
    outbox_max_attempts: int = Field(default=30, ge=1)
    # Comments one task may make on one post (0: no limit); a model repeating itself stops.
    max_writes_per_post: int = Field(default=1, ge=0)
    # The MCP_CONFIG server that is our mcp_servers.hub: its create_post/create_comment
    # count against the agents' daily write caps.
    hub_tool_server: str = "hub"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # What an agent definition may choose (README "Agent definitions"): endpoints for
    # brain.api_base, variables for brain.api_key_env; AGENTS_STRICT refuses unknown keys.
    provider_base_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    agent_key_envs: Annotated[list[str], NoDecode] = Field(default_factory=list)
    agents_strict: bool = False
    # When the Hub's budget endpoint does not answer: run the task anyway, or requeue it.
    budget_unreachable: Literal["run", "refuse"] = "run"
    # package.module:function asked before every tool call (native loop and the CLI
    # gateway): None allows, a string refuses (worker._hooks). Imported once, at start.
    can_execute_tool: str | None = None
    # The coding-agent CLIs' sandbox (README "Executors"): "off" runs them unconfined.
    cli_sandbox: Literal["on", "off"] = "on"
    cli_sandbox_memory_mb: int = Field(default=4096, ge=64)
    cli_sandbox_max_processes: int = Field(default=256, ge=8)
    cli_sandbox_max_file_mb: int = Field(default=1024, ge=1)
    # Sizes of the sandbox's tmpfs mounts: its workspace, and /tmp and /dev/shm each.
    cli_sandbox_workspace_mb: int = Field(default=1024, ge=16)
    cli_sandbox_tmp_mb: int = Field(default=256, ge=16)
    # The host user a sandbox runs as when the worker is root (nobody by default).
    cli_sandbox_uid: int = Field(default=65534, ge=1)
    cli_sandbox_read_only: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Agent memory's embedding_search (README "Memory"): an OpenAI-compatible base URL
    # (POST {url}/embeddings); unset, such agents search by keyword (warned at start).
    memory_embeddings_url: str | None = None
    memory_embeddings_model: str = Field(default="text-embedding-3-small", min_length=1)
    memory_embeddings_api_key: SecretStr | None = None
    memory_embeddings_timeout_s: float = Field(default=10.0, gt=0)

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

    @field_validator("budget_unreachable", "cli_sandbox", mode="before")
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
