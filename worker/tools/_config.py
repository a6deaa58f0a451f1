"""``MCP_CONFIG``: the MCP servers the worker may use, and the grant each tool requires.

::

    servers:
      hub:    {url: http://127.0.0.1:8101/mcp, first_party: true,
               tools: {search_posts: hub:read, create_post: hub:write}}
      github: {url: https://mcp.example.com/mcp, token: "${GITHUB_MCP_TOKEN}",
               headers: {X-Tenant: "${TENANT}"}, tools: {"*": github:read}}
      time:   {command: mcp-server-time, args: [], env: {TZ: UTC}, pool: true,
               tools: {"*": time:read}}

Each server has exactly one of ``url`` (streamable HTTP, optional ``headers``
and ``token``) or ``command`` (stdio, optional ``args``, ``env``, ``cwd`` and
``pool``). ``pool: true`` starts a stdio server once per worker process and
shares it among the tasks of that process (``worker.tools._pool``) instead of
starting one per task; callers are told apart per call, as for HTTP servers.
``tools`` maps a tool name, or ``"*"`` for every other tool of the server, to
the grant it requires; a tool that maps to nothing is never offered. Server
names match ``^[a-z0-9_-]+$`` and neither start nor end with ``_`` nor hold
``__``, because the model sees ``<server>__<tool>`` and the worker splits it
at the first ``__``.

Credentials are per server. ``token`` is sent as ``Authorization: Bearer``
to that server only. ``first_party: true`` marks our own servers
(``mcp_servers``): only they get the worker's ``MCP_AUTH_TOKEN`` (when they set
no ``token`` or ``Authorization`` header of their own) and the task's signed
capability in each call's ``_meta``. A third-party server gets exactly what its
entry names, nothing else.

``${VAR}`` in ``url``, ``token``, ``headers`` and ``env`` values is replaced
from the worker's environment when the file is loaded, so credentials for a
tool server live in the environment, not in the file. Those values are kept as
``SecretStr`` so they never show in a repr or a log line. A stdio server gets
only those ``env`` values plus a minimal safe environment (PATH, HOME, ...),
never the worker's own keys.

``scope`` states, per tool of a third-party server, which argument names the call's
target and which values a task may give it (``worker.tools._scope.ArgumentRule``)::

      tracker: {url: https://tracker.example.com/mcp,
                tools: {comment_issue: tracker:write},
                scope: {comment_issue: {argument: issue, allow: ["$posts", "OPS-1"]}}}

The worker cannot know what a foreign server's tool writes, or where: a rule bounds the
one argument it names, by exact value; a tool without a rule is bounded by its grant alone,
and is withheld from private tasks unless ``private_ok`` lists it (or ``"*"``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from worker.exceptions import ConfigurationError
from worker.tools._grants import check_required_grant, describe_validation_error
from worker.tools._scope import ArgumentRule

_SERVER_NAME = re.compile(r"^[a-z0-9_-]+$")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ALL_TOOLS = "*"


def _check_server_name(name: str) -> str:
    # ``<server>__<tool>`` is split at the first ``__``: a server name ending in ``_``
    # (``a_`` + ``__x``) or holding ``__`` would split in the wrong place.
    if not _SERVER_NAME.match(name) or "__" in name or name.startswith("_") or name.endswith("_"):
        raise ValueError(
            f"server name {name!r} must match ^[a-z0-9_-]+$, not start or end with '_' "
            "and not contain '__' (tools are named <server>__<tool>)"
        )
    return name


ServerName = Annotated[str, AfterValidator(_check_server_name)]
RequiredGrant = Annotated[str, AfterValidator(check_required_grant)]


class McpServerConfig(BaseModel):
    """One server: HTTP when ``url`` is set, stdio when ``command`` is set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None
    headers: Mapping[str, SecretStr] = Field(default_factory=dict)
    # Sent as ``Authorization: Bearer <token>`` to this server only.
    token: SecretStr | None = None
    # One of our own servers: gets MCP_AUTH_TOKEN and the task's capability.
    first_party: bool = False
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, SecretStr] = Field(default_factory=dict)
    cwd: Path | None = None
    # A stdio server started once per worker process and shared by its tasks.
    pool: bool = False
    tools: Mapping[str, RequiredGrant]
    # Per tool: the argument that names its target, and the values a task may give it.
    scope: Mapping[str, ArgumentRule] = Field(default_factory=dict)
    # Tools (or "*") offered to private tasks without an argument rule (docs/task-scope.md).
    private_ok: tuple[str, ...] = ()

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return url

    @field_validator("tools")
    @classmethod
    def _some_tools(cls, tools: Mapping[str, str]) -> Mapping[str, str]:
        if not tools:
            raise ValueError('map at least one tool (or "*") to the grant it requires')
        return tools

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of url (HTTP server) or command (stdio server)")
        if self.url is not None and (self.args or self.env or self.cwd is not None):
            raise ValueError("args, env and cwd belong to stdio servers (command), not to url")
        if self.url is not None and self.pool:
            raise ValueError(
                "pool belongs to stdio servers (command): an HTTP server (url) is already "
                "shared by every task"
            )
        if self.command is not None and (self.headers or self.token is not None):
            raise ValueError("headers and token belong to HTTP servers (url), not to command")
        if self.token is not None and any(key.lower() == "authorization" for key in self.headers):
            raise ValueError("give token or an Authorization header, not both")
        if self.command == "":
            raise ValueError("command must not be empty")
        return self

    @property
    def is_http(self) -> bool:
        return self.url is not None

    def http_headers(self, worker_token: str | None) -> dict[str, str]:
        """The headers this server gets: its own, its ``token``, and ``worker_token``
        (``MCP_AUTH_TOKEN``) only for a first-party server without credentials of its own."""
        headers = {key: value.get_secret_value() for key, value in self.headers.items()}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token.get_secret_value()}"
        has_own = any(key.lower() == "authorization" for key in headers)
        if self.first_party and worker_token and not has_own:
            headers["Authorization"] = f"Bearer {worker_token}"
        return headers

    def credentials_sent(self, worker_token: str | None) -> str:
        """Which credentials ``http_headers`` sends, named for an operator."""
        if self.token is not None:
            return "its token from MCP_CONFIG"
        if any(key.lower() == "authorization" for key in self.headers):
            return "its Authorization header from MCP_CONFIG"
        if self.first_party and worker_token:
            return "MCP_AUTH_TOKEN"
        return (
            "the request without credentials (no token; MCP_AUTH_TOKEN goes to first_party servers)"
        )

    def identity(self, name: str) -> str:
        """A digest of the server's name and entry, secrets included, for the per-process caches.

        Equal entries give equal identities; any edit (a new token, another argument) gives
        another, so a cached tool list or pooled process never outlives the entry it came from.
        The digest, not the entry, is what the caches keep: no secret sits in a key.
        """
        fields = self.model_dump(mode="json", exclude={"headers", "token", "env"})
        fields["name"] = name
        for secret_field in ("headers", "env"):
            values: Mapping[str, SecretStr] = getattr(self, secret_field)
            fields[secret_field] = {key: value.get_secret_value() for key, value in values.items()}
        fields["token"] = None if self.token is None else self.token.get_secret_value()
        encoded = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()

    def open_to_private(self, tool: str) -> bool:
        """Whether a private task may call ``tool``: it has an argument rule, or the
        operator lists it (or ``"*"``) in ``private_ok``."""
        return tool in self.scope or tool in self.private_ok or ALL_TOOLS in self.private_ok

    def required_grant(self, tool: str) -> str | None:
        """The grant ``tool`` requires, the ``"*"`` entry otherwise; None if it is not offered."""
        return self.tools.get(tool, self.tools.get(ALL_TOOLS))


class McpConfig(BaseModel):
    """All configured servers by name. ``McpConfig()`` has none (no tools at all)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    servers: Mapping[ServerName, McpServerConfig] = Field(default_factory=dict)

    def required_grant(self, server: str, tool: str) -> str | None:
        """The grant ``<server>__<tool>`` requires; None for an unknown server or unmapped tool."""
        entry = self.servers.get(server)
        return None if entry is None else entry.required_grant(tool)


def load_mcp_config(path: Path) -> McpConfig:
    """Read ``MCP_CONFIG``; raise ConfigurationError naming the file, server and field."""
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: cannot read the MCP configuration: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: expected a mapping with 'servers'")
    servers = raw.get("servers")
    if isinstance(servers, dict):
        for name, server in servers.items():
            if isinstance(server, dict):
                _expand_environment(server, where=f"{path}: servers.{name}")
    try:
        return McpConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(f"{path}: {describe_validation_error(exc)}") from exc


def _expand_environment(server: dict[str, Any], *, where: str) -> None:
    """Replace ``${VAR}`` in the server's url, token, header and env values, in place."""
    for field in ("url", "token"):
        if isinstance(server.get(field), str):
            server[field] = _expand(server[field], where=f"{where}.{field}")
    for field in ("headers", "env"):
        values = server.get(field)
        if isinstance(values, dict):
            for key, value in values.items():
                if isinstance(value, str):
                    values[key] = _expand(value, where=f"{where}.{field}.{key}")


def _expand(text: str, *, where: str) -> str:
    def lookup(match: re.Match[str]) -> str:
        variable = match.group(1)
        value = os.environ.get(variable)
        if value is None:
            raise ConfigurationError(f"{where}: environment variable {variable} is not set")
        return value

    return _ENV_REFERENCE.sub(lookup, text)
