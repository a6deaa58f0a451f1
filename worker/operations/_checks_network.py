"""The network half of ``agent-worker check``: does Redis, the Hub, each HTTP MCP server answer?

Each probe returns None when the other side answered as expected, else one line
saying what went wrong. Lines never carry a credential: URLs are shown without
user info or query string, and errors by their class name only (their text may
quote a URL with a token in it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx2
from redis import Redis
from redis.exceptions import RedisError

from hub_client.retry_rules import Failure, classify_status
from worker._network import client_ssl_context, shown_url
from worker.redis_io import access_refusal

# An MCP ``initialize`` request, as the worker's MCP client sends it when a task opens a server.
_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "agent-worker-check", "version": "1"},
    },
}
_MCP_ACCEPT = "application/json, text/event-stream"


def probe_redis(url: str, *, timeout_s: float, client: Redis | None = None) -> str | None:
    """PING the Redis at ``url`` (or ``client``, built elsewhere, e.g. through sentinels)."""
    if client is None:
        try:
            client = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        except ValueError as exc:
            return f"not a Redis URL ({exc})"
    try:
        client.ping()
    except RedisError as exc:
        refusal = access_refusal(exc)
        if refusal is not None:
            return f"{refusal} (at {shown_url(url)})"
        return f"Redis at {shown_url(url)} does not answer ({type(exc).__name__})"
    finally:
        client.close()
    return None


@dataclass(frozen=True)
class HubProblem:
    """What the Hub probe found wrong: a Hub that does not answer (it may come back: the
    worker waits for it) or one that refuses the key (every task would fail on it)."""

    message: str
    key_refused: bool


def probe_hub(hub_url: str, api_key: str | None, *, timeout_s: float) -> HubProblem | None:
    """Ask the Hub for its stale agents: any answer means reachable; 401/403 means a bad key."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{hub_url.rstrip('/')}/api/v1/agents"
    try:
        with _client(timeout_s) as client:
            response = client.get(url, params={"stale": "true", "limit": "1"}, headers=headers)
    except httpx2.HTTPError as exc:
        message = f"the Hub at {shown_url(hub_url)} does not answer ({type(exc).__name__})"
        return HubProblem(message, key_refused=False)
    if classify_status(response.status_code) is Failure.AUTH:
        held = "HUB_API_KEY" if api_key else "no HUB_API_KEY (unset)"
        message = f"the Hub at {shown_url(hub_url)} refuses {held} (HTTP {response.status_code})"
        return HubProblem(message, key_refused=True)
    return None


def probe_mcp_server(
    url: str, headers: Mapping[str, str], auth_token: str | None, *, timeout_s: float
) -> str | None:
    """Send an MCP ``initialize``; only the status line is read (the body may be a stream)."""
    request_headers = {"Accept": _MCP_ACCEPT, **headers}
    if auth_token:
        request_headers["Authorization"] = f"Bearer {auth_token}"
    try:
        with (
            _client(timeout_s) as client,
            client.stream("POST", url, json=_INITIALIZE, headers=request_headers) as response,
        ):
            status = response.status_code
            session = response.headers.get("mcp-session-id")
            if session:
                # Close the session the probe opened, so the server does not keep it.
                client.delete(url, headers={**request_headers, "mcp-session-id": session})
    except httpx2.HTTPError as exc:
        return f"{shown_url(url)} does not answer ({type(exc).__name__})"
    if classify_status(status) is Failure.AUTH:
        held = "MCP_AUTH_TOKEN" if auth_token else "no MCP_AUTH_TOKEN (unset)"
        return f"{shown_url(url)} refuses {held} (HTTP {status})"
    if status >= 300:
        return f"{shown_url(url)} answered HTTP {status} to an MCP initialize"
    return None


def _client(timeout_s: float) -> httpx2.Client:
    return httpx2.Client(timeout=timeout_s, verify=client_ssl_context(), trust_env=False)
