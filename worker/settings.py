"""All configuration, from environment variables (DESIGN.md section 3 and the README table)."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.exceptions import ConfigurationError


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    hub_url: str = "http://127.0.0.1:8100"
    hub_api_key: SecretStr | None = None
    # A directory, or an http(s) base URL serving the same layout (R2, Git raw).
    agents_dir: str = "agents"
    mcp_config: Path | None = None
    grant_policy: Path | None = None
    strict_grants: bool = False
    metrics_port: int = Field(default=9108, ge=0, le=65535)
    # When set, the worker writes its metrics there on exit (burst and cron workers).
    metrics_textfile: Path | None = None
    prices_file: Path | None = None
    errors_agent_id: str = "agent-worker"
    mcp_auth_token: SecretStr | None = None

    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None

    # Further settings (README configuration table).
    agent_cache_ttl_s: int = Field(default=300, ge=0)
    result_ttl_s: int = Field(default=7 * 86_400, ge=60)
    job_timeout_grace_s: int = Field(default=60, ge=5)
    tool_output_max_chars: int = Field(default=20_000, ge=200)
    context_budget_chars: int = Field(default=200_000, ge=1_000)
    max_same_call_repeats: int = Field(default=3, ge=1)
    max_consecutive_error_steps: int = Field(default=3, ge=1)
    llm_max_retries: int = Field(default=4, ge=0, le=20)
    llm_timeout_s: float = Field(default=120.0, gt=0)
    hub_timeout_s: float = Field(default=15.0, gt=0)
    mcp_timeout_s: float = Field(default=60.0, gt=0)
    requeue_max_attempts: int = Field(default=5, ge=0)
    requeue_delay_s: float = Field(default=30.0, ge=0)
    # Fleet-wide model call limits per provider and model (0: none).
    llm_requests_per_minute: int = Field(default=0, ge=0)
    llm_tokens_per_minute: int = Field(default=0, ge=0)
    # How long a task waits for its agent's free slot (or its own lease) before requeueing.
    busy_wait_s: float = Field(default=10.0, ge=0)
    busy_requeue_delay_s: float = Field(default=15.0, ge=1)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    def secret_values(self) -> list[str]:
        """Every secret this process holds, for redaction."""
        secrets = [
            self.hub_api_key,
            self.mcp_auth_token,
            self.anthropic_api_key,
            self.openai_api_key,
        ]
        return [s.get_secret_value() for s in secrets if s is not None and s.get_secret_value()]


def load_settings() -> Settings:
    """Read the environment; raise ConfigurationError naming the first bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        variable = str(error["loc"][0]).upper() if error["loc"] else "environment"
        raise ConfigurationError(f"invalid setting {variable}: {error['msg']}") from None


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
