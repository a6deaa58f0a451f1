"""What the gateway must know and the CLI must not see: the gateway's secrets.

``MCP_AUTH_TOKEN``, the tool credentials ``MCP_CONFIG`` references as ``${VAR}``, the
task's signed capability and the agent's write caps (with the fleet's Redis, a
credential): one JSON object, which the CLI executors write on the stdin of the gateway
they start (no file), and which a gateway run by hand over ``--stdio`` reads from the
file ``GATEWAY_SECRETS_FILE`` names. The gateway loads it into its own environment before
it reads ``MCP_CONFIG``. It gets the capability, never ``CAPABILITY_KEY``: with the key,
whatever could read the secrets could sign for any agent.

With write caps (``GatewayWriteCaps``) the gateway counts the CLI's Hub writes in the
same Redis counters as the native loop.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

from pydantic import SecretStr

from worker.hub_writes import WriteCaps

# The gateway imports this module at every start: what only the worker side, or only a
# gateway with write caps, uses is imported where it is used.
if TYPE_CHECKING:
    from redis import Redis

    from worker.settings import Settings
    from worker.tools import EffectiveGrants, TaskScope

MCP_AUTH_TOKEN = "MCP_AUTH_TOKEN"
# The task's capability, forwarded to first-party servers.
CAPABILITY = "GATEWAY_CAPABILITY"
# The fleet's Redis and the agent's write caps (``GatewayWriteCaps``).
WRITE_CAPS = "GATEWAY_WRITE_CAPS"

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def referenced_variables(mcp_config: Path) -> list[str]:
    """Names of the ``${VAR}`` the MCP configuration file expands (its tool credentials)."""
    try:
        text = mcp_config.read_text(encoding="utf-8")
    except OSError:
        return []
    return sorted(set(_ENV_REFERENCE.findall(text)))


def gateway_secrets(mcp_config: Path, settings: Settings) -> dict[str, str]:
    """MCP_AUTH_TOKEN and the tool credentials MCP_CONFIG references, from the worker: what
    the secrets file hands the gateway, and what the executor masks in its report."""
    secrets = {
        name: os.environ[name] for name in referenced_variables(mcp_config) if name in os.environ
    }
    token = settings.mcp_auth_token
    if token is not None and token.get_secret_value():
        secrets[MCP_AUTH_TOKEN] = token.get_secret_value()
    return secrets


def gateway_capability(
    capability_key: SecretStr | None,
    *,
    agent_id: str,
    task_id: str,
    grants: EffectiveGrants,
    deadline_epoch_s: float,
    scope: TaskScope,
) -> dict[str, str]:
    """The secrets-file entry carrying the task's capability (for its scope); empty
    without a key."""
    if capability_key is None:
        return {}
    from worker.tools import mint_capability

    token = mint_capability(
        capability_key.get_secret_value(),
        agent_id=agent_id,
        task_id=task_id,
        grants=grants,
        expires_at=deadline_epoch_s,
        scope=scope,
    )
    return {CAPABILITY: token}


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayWriteCaps:
    """What the gateway needs to hold the agent's write caps: where the fleet counts them
    (Redis, as the worker connects to it) and the caps. Only ever in the secrets file."""

    caps: WriteCaps
    hub_server: str
    redis_url: str
    redis_sentinels: str | None = None
    redis_sentinel_master: str = "mymaster"
    redis_sentinel_password: str | None = None

    @classmethod
    def of(cls, settings: Settings, caps: WriteCaps) -> GatewayWriteCaps:
        password = settings.redis_sentinel_password
        return cls(
            caps=caps,
            hub_server=settings.hub_tool_server,
            redis_url=settings.redis_url,
            redis_sentinels=settings.redis_sentinels,
            redis_sentinel_master=settings.redis_sentinel_master,
            redis_sentinel_password=password.get_secret_value() if password else None,
        )

    def secrets(self) -> dict[str, str]:
        """The secrets-file entry."""
        caps = self.caps
        fields = {
            "max_daily_posts": caps.max_daily_posts,
            "max_daily_comments": caps.max_daily_comments,
            "min_interval_s": caps.min_interval_s,
            "max_writes_per_post": caps.max_writes_per_post,
            "max_responses_per_thread": caps.max_responses_per_thread,
            "hub_server": self.hub_server,
            "redis_url": self.redis_url,
            "redis_sentinels": self.redis_sentinels,
            "redis_sentinel_master": self.redis_sentinel_master,
            "redis_sentinel_password": self.redis_sentinel_password,
        }
        return {WRITE_CAPS: json.dumps(fields)}

    @classmethod
    def pop_from(cls, secrets: dict[str, str]) -> GatewayWriteCaps | None:
        """Take the entry out of the secrets (it is no variable for the gateway's
        environment); None without one. ValueError when it is malformed."""
        raw = secrets.pop(WRITE_CAPS, None)
        if raw is None:
            return None
        try:
            fields: Any = json.loads(raw)
            return cls(
                caps=WriteCaps(
                    max_daily_posts=_optional_int(fields["max_daily_posts"]),
                    max_daily_comments=_optional_int(fields["max_daily_comments"]),
                    min_interval_s=_optional_float(fields["min_interval_s"]),
                    max_writes_per_post=int(fields["max_writes_per_post"]),
                    max_responses_per_thread=_optional_int(fields["max_responses_per_thread"]),
                ),
                hub_server=str(fields["hub_server"]),
                redis_url=str(fields["redis_url"]),
                redis_sentinels=fields.get("redis_sentinels") or None,
                redis_sentinel_master=str(fields.get("redis_sentinel_master") or "mymaster"),
                redis_sentinel_password=fields.get("redis_sentinel_password") or None,
            )
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{WRITE_CAPS} in the secrets file is malformed") from None

    def secret_values(self) -> list[str]:
        """What the gateway must mask: the Redis URL, its password and the sentinels'."""
        url_password = urlsplit(self.redis_url).password
        values = (self.redis_url, url_password, self.redis_sentinel_password)
        return [value for value in values if value]

    def connect(self) -> Redis:
        """A client to the fleet's Redis, built as the worker builds its own."""
        from worker.redis_io import connect
        from worker.settings import Settings

        password = self.redis_sentinel_password
        # Only the connection fields: the gateway has none of the worker's other settings.
        settings = Settings.model_construct(
            redis_url=self.redis_url,
            redis_sentinels=self.redis_sentinels,
            redis_sentinel_master=self.redis_sentinel_master,
            redis_sentinel_password=SecretStr(password) if password else None,
        )
        return connect(settings)


def _optional_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _optional_float(value: object) -> float | None:
    return None if value is None else float(str(value))


def write_secrets_file(path: Path, secrets: Mapping[str, str]) -> None:
    """Write ``secrets`` as JSON that only this user can read."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        json.dump(dict(secrets), file)


def read_secrets(source: TextIO) -> dict[str, str]:
    """The gateway's one way to read its secrets: a JSON object from ``source`` (its
    stdin, or the file ``GATEWAY_SECRETS_FILE`` names); nothing there means no secrets."""
    text = source.read()
    if not text.strip():
        return {}
    values: Any = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError(f"the gateway's secrets ({source.name}) must be a JSON object")
    return {str(key): str(value) for key, value in values.items()}
