"""Outgoing connections: endpoint URLs in one comparable form, and one shared TLS context.

Two spellings of one endpoint (``HTTPS://Api.Example:443/v1/``, ``https://api.example/v1``)
must compare equal, or an operator's allow-list would be easy to miss and a worker
key could be paired with the wrong endpoint. ``shown_url`` is any URL in the form
that may be printed: without the credentials it may carry.

httpx2 builds a new SSL context for each client it creates, and building one reads
the whole CA bundle: 30-40 ms. A job process opens several clients (the Hub, the
model provider, each MCP server over HTTP), so ``client_ssl_context`` builds one per
process; ``worker.pipeline.preload`` builds it in the worker parent and every forked
job process inherits it.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Mapping
from functools import cache
from typing import get_args
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr
from pydantic.fields import FieldInfo

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def normalise_base_url(url: str) -> str:
    """``scheme://host[:port]/path`` lower-cased where case does not matter, without a
    default port, a trailing slash or a fragment. Raises ValueError for anything that is
    not an absolute http(s) URL, or that carries credentials."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:  # a port that is not a number, a broken IPv6 literal
        raise ValueError(f"{url!r} is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not an absolute http(s) URL")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        host = f"{host}:{port}"
    if parts.username is not None or parts.password is not None:
        # Credentials belong in a key variable, never in a URL that is logged and compared.
        raise ValueError(f"{scheme}://{host}{parts.path}: must not carry user:password@")
    return urlunsplit((scheme, host, parts.path.rstrip("/"), parts.query, ""))


def shown_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to print. Host and port are kept
    as written, so a URL with a broken port can still be quoted."""
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, address, parts.path, "", ""))


_REDIS_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str) -> str:
    """``url`` when redis-py can connect with it; else ValueError naming the wrong part.

    redis-py's own errors come later, as a traceback from whichever command connected
    first, and a database path that is not a number is silently read as database 0.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a broken IPv6 literal
        raise ValueError(f"is not a URL ({exc})") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError(f"must start with redis://, rediss:// or unix://, got {shown_url(url)!r}")
    if parts.scheme == "unix":
        return url
    try:
        port = parts.port  # None when the URL names none: redis-py then uses 6379
    except ValueError:  # not a number, or above 65535
        port = 0
    if port == 0:
        raise ValueError(f"the port must be a number from 1 to 65535, got {shown_url(url)!r}")
    database = parts.path.strip("/")
    if database and not database.isdigit():
        raise ValueError(
            f"the database (the path) must be a number such as /0, got {shown_url(url)!r}"
        )
    return url


def parse_sentinel_addresses(value: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (IPv6 as ``[::1]:26379``) as (host, port) pairs."""
    addresses = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, separator, port_text = item.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not separator or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{item!r} is not host:port (a sentinel address, port 1-65535)")
        addresses.append((host, int(port_text)))
    if not addresses:
        raise ValueError("no sentinel address given (expected host:port,host:port)")
    return addresses


def same_endpoint(first: str | None, second: str | None) -> bool:
    """Whether two base URLs name one endpoint (None: the SDK's default endpoint)."""
    if first is None or second is None:
        return first is None and second is None
    try:
        return normalise_base_url(first) == normalise_base_url(second)
    except ValueError:
        return False


def split_list_setting(value: object, variable: str) -> object:
    """A list setting from the environment: a JSON list, or comma-separated values."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{variable} is not a valid JSON list ({exc.msg})") from None
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ValueError(f"{variable} must be a JSON list of strings")
        return [item.strip() for item in items if item.strip()]
    return [item.strip() for item in text.split(",") if item.strip()]


def base_url_allow_list(urls: list[object]) -> list[str]:
    """PROVIDER_BASE_URLS, normalised for exact matching."""
    return [normalise_base_url(str(url)) for url in urls]


def worker_secret_variables(fields: Mapping[str, FieldInfo]) -> frozenset[str]:
    """The variables that hold the worker's own secrets: every SecretStr setting, and the
    Redis URLs (they may carry a password). Derived from Settings, so a secret added there
    is covered without a list to keep up to date."""
    secret_fields = {
        name.upper()
        for name, info in fields.items()
        if info.annotation is SecretStr or SecretStr in get_args(info.annotation)
    }
    return frozenset(secret_fields | {"REDIS_URL", "RQ_REDIS_URL"})


def agent_key_allow_list(names: list[object], worker_secrets: frozenset[str]) -> list[str]:
    """AGENT_KEY_ENVS: variable names, none of them one of the worker's own secrets."""
    allowed = []
    for item in names:
        name = str(item)
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if name.upper() in worker_secrets:
            raise ValueError(f"{name} holds the worker's own secret; it cannot be an agent key")
        allowed.append(name)
    return allowed


# Where each provider's SDK sends requests when no base URL is configured.
SDK_DEFAULT_BASE_URLS = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com/v1",
}


def operator_endpoint(provider: str, configured: str | None) -> str | None:
    """The endpoint the operator's key for ``provider`` goes to: its *_BASE_URL, else the
    SDK's default (None for a provider this module does not know)."""
    return configured or SDK_DEFAULT_BASE_URLS.get(provider)


@cache
def client_ssl_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """The context httpx2 builds for ``verify=True`` (and this ``trust_env``), built once.

    Pass it as ``verify=`` to a client; ``trust_env`` must match the client's own,
    since it decides whether ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are honoured.
    """
    # Imported here: settings validation reads the endpoint helpers above and must not
    # pay for the HTTP client.
    import httpx2

    return httpx2.create_ssl_context(trust_env=trust_env)


def check_allow_entry(entry: str) -> str:
    """An ``EGRESS_ALLOW`` entry: a host name, or an http(s) URL prefix; ValueError else."""
    entry = entry.strip()
    if "://" in entry:
        parts = urlsplit(entry)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{entry!r} is not an http(s) URL prefix")
    elif not entry or "/" in entry or "@" in entry or any(char.isspace() for char in entry):
        raise ValueError(f"{entry!r} is neither a host name nor an http(s) URL prefix")
    return entry
