"""Our MCP servers (``python -m mcp_servers.hub|web|memory``) as subprocesses on free ports.

``with running_mcp("hub", hub_url=hub.url) as server:`` starts the server, waits until it
accepts connections and stops it when the block ends, also when the test fails.
``mcp_http_session(server.url, auth_token=...)`` opens an initialized client session;
``caller_meta`` is the ``_meta`` of a call and ``text_of`` the text of its one result.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, RequestParamsMeta, TextContent

from tests.support import SERVER_READY_TIMEOUT_S
from tests.support.redis_server import free_port

# Variables the servers read; a test sets them explicitly or not at all.
_SERVER_VARIABLES = (
    "HUB_URL",
    "HUB_API_KEY",
    "MCP_AUTH_TOKEN",
    "MCP_WEB_ALLOW_NETWORKS",
    "CAPABILITY_KEY",
)


class McpServerFailedToStart(RuntimeError):
    pass


@dataclass
class RunningMcpServer:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stderr_text(self) -> str:
        """What the server logged so far (JSON lines)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def server_environment(variables: Mapping[str, str | None]) -> dict[str, str]:
    """This process's environment without the servers' own variables, plus ``variables``."""
    environment = {k: v for k, v in os.environ.items() if k not in _SERVER_VARIABLES}
    environment.update({k: v for k, v in variables.items() if v is not None})
    return environment


@contextmanager
def running_mcp(
    server: str,
    *,
    auth_token: str | None = None,
    capability_key: str | None = None,
    hub_url: str | None = None,
    hub_api_key: str | None = None,
    allow_networks: str | None = None,
    redis_url: str | None = None,
    agents_dir: str | None = None,
    environment: Mapping[str, str] | None = None,
) -> Iterator[RunningMcpServer]:
    """``python -m mcp_servers.<server>`` (``hub``, ``web``, ``memory``) over streamable
    HTTP, or the module ``server`` names when it is dotted (the test servers under
    ``tests/support/mcp_test_servers``). Each reads only its own variables: hub
    ``hub_url`` and ``hub_api_key``, web ``allow_networks`` (e.g. loopback), memory
    ``redis_url`` and ``agents_dir``, every one ``auth_token`` and ``capability_key``;
    ``environment`` adds any other (a test server's ``RECORD_FILE``)."""
    variables: dict[str, str | None] = {
        "MCP_AUTH_TOKEN": auth_token,
        "CAPABILITY_KEY": capability_key,
        "HUB_URL": hub_url,
        "HUB_API_KEY": hub_api_key,
        "MCP_WEB_ALLOW_NETWORKS": allow_networks,
        "REDIS_URL": redis_url,
        "AGENTS_DIR": agents_dir,
        **(environment or {}),
    }
    module = server if "." in server else f"mcp_servers.{server}"
    with _running(module, server_environment(variables)) as running:
        yield running


@contextmanager
def _running(module: str, environment: dict[str, str]) -> Iterator[RunningMcpServer]:
    port = free_port()
    descriptor, log_name = tempfile.mkstemp(prefix=f"{module}-", suffix=".log")
    log_path = Path(log_name)
    with os.fdopen(descriptor, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env=environment,
        )
    server = RunningMcpServer(port=port, process=process, log_path=log_path)
    try:
        _wait_accepting(server)
        yield server
    finally:
        server.stop()
        log_path.unlink(missing_ok=True)


def _wait_accepting(server: RunningMcpServer) -> None:
    deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
    while True:
        if server.process.poll() is not None:
            raise McpServerFailedToStart(
                f"exited with {server.process.returncode}: {server.stderr_text()[-2000:]}"
            )
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise McpServerFailedToStart(
                    f"port {server.port} not accepting after {SERVER_READY_TIMEOUT_S}s: "
                    f"{server.stderr_text()[-2000:]}"
                ) from None
            time.sleep(0.05)


@asynccontextmanager
async def mcp_http_session(
    url: str, *, auth_token: str | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session over streamable HTTP, with a bearer token if given."""
    headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
    async with (
        httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(30.0, read=300.0), trust_env=False
        ) as http_client,
        streamable_http_client(url, http_client=http_client) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream) as session,
    ):
        await session.initialize()
        yield session


def caller_meta(
    agent_id: str, *, task_id: str, step: int = 1, capability: str | None = None
) -> RequestParamsMeta:
    """The ``_meta`` the worker sends with a tool call (see CallContext.meta), with the
    task's signed capability when given."""
    values = {
        "agent_id": agent_id,
        "task_id": task_id,
        "idempotency_key": f"{task_id}:tool:{step}:0",
    }
    if capability is not None:
        values["capability"] = capability
    # mypy cannot read RequestParamsMeta's open keys (PEP 728), hence the cast.
    return cast(RequestParamsMeta, values)


def text_of(result: CallToolResult) -> str:
    """The text of a tool result that holds exactly one text block."""
    assert len(result.content) == 1
    content = result.content[0]
    assert isinstance(content, TextContent)
    return content.text
