"""MCP server ``gateway``: one task's granted tools, for a coding-agent CLI.

Started by the CLI executor (claude-code, opencode, goose) for one task, outside the
CLI's sandbox: ``python -m mcp_servers.gateway --socket PATH`` serves MCP on a Unix
socket that the sandbox's bridge (the CLI's only MCP server) connects to. Everything it
needs comes from the environment block the executor set (``worker.executors._gateway_link``):
the agent and task, the effective grants, the task's ``allowed_tools``, ``MCP_CONFIG``;
``MCP_AUTH_TOKEN``, the tool credentials, the capability and the write caps come on its
stdin (``worker.executors._gateway_secrets``). ``--stdio`` serves one session over stdio
instead (by hand, tests), its secrets from ``GATEWAY_SECRETS_FILE``. Nothing comes from
the model.

It connects to the configured servers through the worker's own grant-checked
``McpToolbox``, offers only the tools the agent may use (``<server>__<tool>``
with their input schemas), and runs every call through the same dispatcher as
the native loop: an unknown tool answers ``Error: Unknown tool '<name>'``, a tool
without its grant ``Error: Missing grant <grant>`` (never executed; in the call log, from
which the executor logs ``grant_denied`` and ``tool_call`` once; over ``--stdio`` the gateway
logs them itself), arguments that do not match the schema are refused,
and the rest is forwarded with the worker's ``_meta`` identity (``agent_id``,
``task_id``, and ``idempotency_key = <task_id>:tool:<digest>:<k>`` for the k-th call of
one tool with the same arguments: a CLI re-runs a task from the start, so a key must
name the write, not its position; see ``worker.tools._idempotency``).
Each call is also written to the call log the executor reads after the run
(``worker.executors._call_log``).

The agent's write caps hold here as in the native loop: with ``GATEWAY_WRITE_CAPS`` in
the secrets file (the fleet's Redis and the caps), the hub server's ``create_post`` and
``create_comment`` go through the same ``CappedToolbox`` and Redis counters. A write
over a cap is not made; the CLI's model reads the native loop's text (``Error: daily
comment limit (N) reached``) and the call log tells the worker, which logs
``hub_write_refused`` and counts ``agent_hub_writes_refused_total``. So does the task's
scope (from its capability, else from the environment block): a write outside it is not
made (``Error: out of scope: ...``), and the call log tells the worker, which lists it in
the report's ``refused_writes``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from mcp_servers._gateway_inputs import TaskCapability, gateway_secrets, task_capability
from mcp_servers._gateway_socket import serve_socket
from worker._hooks import allow_every_tool
from worker._version import package_version
from worker.exceptions import ConfigurationError
from worker.executors import (
    MCP_AUTH_TOKEN,
    CallLogWriter,
    GatewaySpec,
    GatewayWriteCaps,
)
from worker.hub_writes import CappedToolbox, WriteLedger
from worker.logs import log_event, set_redactor
from worker.loop import (
    ArgumentRedactingToolbox,
    CanExecuteTool,
    EventBus,
    GrantDenied,
    LoopEvent,
    LoopObserver,
    ToolDispatcher,
    log_observer,
)
from worker.models import ToolCall, UntrustedBlocks
from worker.redaction import process_redactor
from worker.tools import (
    ContentKeyedToolbox,
    EffectiveGrants,
    McpConfig,
    McpToolbox,
    ScopeCell,
    ScopedToolbox,
    Toolbox,
    fixed_capability,
    load_can_execute_tool,
    load_mcp_config,
)
from worker.tracing import attached, configure_tracing, environment_context

# It starts once per CLI task: capabilities (PyJWT, cryptography) load only when the task
# has one, the HTTP serving helpers only when a signal asks it to stop.
if TYPE_CHECKING:
    from redis import Redis

    from worker.tools import Capability

SERVER_NAME = "gateway"
CAPABILITY_EXPIRED = "Error: the task's capability has expired; no tool runs past its deadline"


@dataclass(eq=False)
class Gateway:
    """The open toolbox of one task and the dispatcher every call goes through."""

    spec: GatewaySpec
    toolbox: McpToolbox
    dispatcher: ToolDispatcher
    call_log: CallLogWriter
    calls: itertools.count[int]
    # The task's capability, when the worker signs them: no call runs after it expires.
    capability: Capability | None = None
    # Masks the secrets this gateway knows in what the CLI's model reads.
    redact: Callable[[str], str] = str

    def tools(self) -> list[mcp_types.Tool]:
        return [
            mcp_types.Tool(
                name=spec.name, description=spec.description, input_schema=spec.input_schema
            )
            for spec in self.toolbox.offered()
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        step = next(self.calls)
        if self.capability is not None and self.capability.remaining_s() <= 0:
            return mcp_types.CallToolResult(
                content=[mcp_types.TextContent(text=CAPABILITY_EXPIRED)], is_error=True
            )
        call = ToolCall(id=f"gateway-{step}", name=name, arguments=json.dumps(arguments))
        remaining_s = self.spec.deadline_epoch_s - time.time()
        timeout_s = max(0.001, min(remaining_s, self.spec.tool_timeout_s))
        record = await self.dispatcher.run(step, 1, call, timeout_s)
        self.call_log.tool_call(step, record)
        if record.outcome.denied and self.spec.strict_grants:
            # The executor ends the task when it reads this; the call itself never ran.
            self.call_log.autonomy_violation(
                step,
                f"agent {self.spec.agent_id!r} called {name!r} without its grant (strict grants)",
            )
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(text=self.presented(name, record.content))],
            is_error=record.is_error,
        )

    def presented(self, name: str, content: str) -> str:
        """A result as the CLI's model reads it: redacted, in the task's untrusted blocks."""
        content = self.redact(content)
        if self.spec.untrusted_nonce is None:
            return content
        return UntrustedBlocks(self.spec.untrusted_nonce).tool_result(name, content)


def build_server(
    spec: GatewaySpec,
    config: McpConfig,
    capability: TaskCapability | None = None,
    *,
    redact: Callable[[str], str] = str,
    write_caps: GatewayWriteCaps | None = None,
    log_calls: bool = True,
) -> Server[Gateway]:
    """The gateway as a low-level MCP server: its tool list is only known once connected.

    With ``capability`` (the task's, from its secrets), identity and grants come from
    it, it goes to first-party servers with every call, and no call runs once it expired.
    With ``write_caps``, Hub writes count against the agent's caps in the fleet's Redis.
    """
    setup = GatewaySetup(
        spec=spec,
        config=config,
        capability=capability.token if capability is not None else None,
        claims=capability.claims if capability is not None else None,
        redact=redact,
        write_caps=write_caps,
        log_calls=log_calls,
    )
    return Server(
        SERVER_NAME,
        version=package_version(),
        instructions="The tools this agent holds grants for, on behalf of the Hub worker.",
        lifespan=setup.open,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )


@dataclass(frozen=True, kw_only=True)
class GatewaySetup:
    """What ``build_server`` was given, opened into a ``Gateway`` when the CLI connects."""

    spec: GatewaySpec
    config: McpConfig
    capability: str | None
    claims: Capability | None
    redact: Callable[[str], str]
    write_caps: GatewayWriteCaps | None
    # Log each call (``tool_call``, ``grant_denied``) here: only when no executor reads the
    # call log and logs them itself (over stdio, by hand), so none is logged twice.
    log_calls: bool

    @asynccontextmanager
    async def open(self, _: Server[Gateway]) -> AsyncIterator[Gateway]:
        """The server's lifespan: the call log, the write caps' Redis, the toolbox."""
        spec = self.spec
        call_log = CallLogWriter(spec.call_log)
        call_log.started(os.getpid())
        redis = self.write_caps.connect() if self.write_caps is not None else None
        try:
            async with McpToolbox.open(
                self.config,
                grants=self.grants(),
                allowed_tools=spec.allowed_tools,
                servers=spec.servers or None,
                auth_token=os.environ.get(MCP_AUTH_TOKEN) or None,
                capability=fixed_capability(self.capability),
                on_spawn=call_log.spawned,
            ) as toolbox:
                yield Gateway(
                    spec=spec,
                    toolbox=toolbox,
                    dispatcher=self.dispatcher(toolbox, call_log, redis),
                    call_log=call_log,
                    calls=itertools.count(1),
                    capability=self.claims,
                    redact=self.redact,
                )
        finally:
            call_log.close()
            if redis is not None:
                redis.close()

    def grants(self) -> EffectiveGrants:
        """The capability's grants when there is one, else those of the environment block.

        Never ``strict``: here a refused call is only recorded (``spec.strict_grants``
        writes the violation to the call log); the executor ends the task."""
        if self.claims is not None:
            return self.claims.effective_grants()
        return EffectiveGrants(
            allowed=frozenset(self.spec.grants), denied=frozenset(self.spec.denied_grants)
        )

    def dispatcher(
        self, toolbox: McpToolbox, call_log: CallLogWriter, redis: Redis | None
    ) -> ToolDispatcher:
        """Every call's way, as in the native loop: write caps (with a Redis), arguments
        redacted, an idempotency key from the call's content, then the grant check."""
        spec = self.spec
        tools: Toolbox = toolbox
        if self.write_caps is not None and redis is not None:
            tools = with_write_caps(toolbox, spec, self.write_caps, redis, call_log)
        scope = self.claims.scope if self.claims is not None else None
        if scope is None:
            scope = spec.scope
        if scope is not None:
            # Refused here first, so the worker hears of it; with a capability, the servers
            # refuse it too.
            tools = ScopedToolbox(
                tools,
                ScopeCell(scope),
                hub_server=self.write_caps.hub_server if self.write_caps else "hub",
                web_server=spec.web_server,
                mcp_config=self.config,
                on_refused=call_log.scope_refused,
            )
        observers: list[LoopObserver] = [lambda event: _log_denial(call_log, event)]
        if self.log_calls:
            # Strictness is the executor's to enforce: here a refusal ends nothing.
            observers.append(log_observer(task_id=spec.task_id, agent_id=spec.agent_id))
        events = EventBus(observers)
        return ToolDispatcher(
            ContentKeyedToolbox(ArgumentRedactingToolbox(tools, self.redact)),
            task_id=spec.task_id,
            agent_id=spec.agent_id,
            events=events,
            max_output_chars=spec.max_output_chars,
            can_execute_tool=tool_check(spec),
        )


async def _list_tools(
    ctx: ServerRequestContext[Gateway], params: mcp_types.PaginatedRequestParams | None
) -> mcp_types.ListToolsResult:
    return mcp_types.ListToolsResult(tools=ctx.lifespan_context.tools())


async def _call_tool(
    ctx: ServerRequestContext[Gateway], params: mcp_types.CallToolRequestParams
) -> mcp_types.CallToolResult:
    return await ctx.lifespan_context.call(params.name, params.arguments or {})


def with_write_caps(
    toolbox: Toolbox,
    spec: GatewaySpec,
    write_caps: GatewayWriteCaps,
    redis: Redis,
    call_log: CallLogWriter,
) -> CappedToolbox:
    """The toolbox with the agent's write caps, as the worker wraps the native loop's;
    a refusal goes to the call log, for the worker to log and count."""
    ledger = WriteLedger(redis, agent_id=spec.agent_id, task_id=spec.task_id, caps=write_caps.caps)
    return CappedToolbox(
        toolbox, ledger, hub_server=write_caps.hub_server, on_refused=call_log.write_refused
    )


def tool_check(spec: GatewaySpec) -> CanExecuteTool:
    """The operator's CAN_EXECUTE_TOOL check, as the native loop asks it before every call."""
    if spec.can_execute_tool is None:
        return allow_every_tool
    if spec.workdir is not None and str(spec.workdir) not in sys.path:
        sys.path.insert(0, str(spec.workdir))  # where the worker runs, and imported it from
    try:
        return load_can_execute_tool(spec.can_execute_tool)
    except ValueError as exc:
        raise ValueError(f"CAN_EXECUTE_TOOL {spec.can_execute_tool!r}: {exc}") from None


def _log_denial(call_log: CallLogWriter, event: LoopEvent) -> None:
    if isinstance(event, GrantDenied):
        call_log.grant_denied(event.step, event.tool, event.required_grant)


async def serve_stdio(server: Server[Gateway]) -> None:
    """Serve until stdin closes, or SIGTERM/SIGINT (the calls in flight are cancelled)."""
    from mcp_servers._serving import serve_stdio_until_signalled  # only when serving

    async def serve() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    await serve_stdio_until_signalled(SERVER_NAME, serve)


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    secrets: dict[str, str] = {}
    write_caps: GatewayWriteCaps | None = None
    try:
        spec = GatewaySpec.from_environment(os.environ)
        secrets = gateway_secrets(options.socket is not None, spec.secrets_file)
        # The Redis URL is for the caps only: never in the environment servers inherit.
        write_caps = GatewayWriteCaps.pop_from(secrets)
        os.environ.update(secrets)
        if spec.workdir is not None:
            os.chdir(spec.workdir)
        config = load_mcp_config(spec.mcp_config)
        tool_check(spec)  # a bad CAN_EXECUTE_TOOL fails here, before the CLI calls a tool
        capability = task_capability(spec, secrets)
    except ConfigurationError as exc:
        print(f"mcp_servers.gateway: {exc.message}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"mcp_servers.gateway: {exc}", file=sys.stderr)
        return 2
    redactor = process_redactor(
        [*secrets.values(), *(write_caps.secret_values() if write_caps else [])]
    )
    set_redactor(redactor)
    try:
        configure_tracing(SERVER_NAME)
    except ConfigurationError as exc:
        print(f"mcp_servers.gateway: {exc.message}", file=sys.stderr)
        return 2
    transport_name = "stdio" if options.socket is None else "socket"
    log_event("server_started", server=SERVER_NAME, transport=transport_name, task=spec.task_id)
    server = build_server(
        spec,
        config,
        capability,
        redact=redactor,
        write_caps=write_caps,
        # Over the socket, the executor logs each call from the call log.
        log_calls=options.socket is None,
    )
    # The MCP SDK's server spans continue the call's _meta context, else this one: the
    # CLI run's, from the TRACEPARENT its executor handed the CLI.
    with attached(environment_context()):
        if options.socket is None:
            anyio.run(serve_stdio, server)
        else:
            anyio.run(serve_socket, server, SERVER_NAME, options.socket)
    log_event("server_stopped", server=SERVER_NAME, task=spec.task_id)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mcp_servers.gateway",
        description="One task's grant-checked tools for a coding-agent CLI. "
        "Configured by the CLI executor through GATEWAY_* environment variables.",
    )
    transport = parser.add_mutually_exclusive_group(required=True)
    transport.add_argument("--stdio", action="store_true", help="serve over stdio")
    transport.add_argument(
        "--socket",
        type=Path,
        help="serve every connection on this Unix socket; the secrets come as one JSON "
        "object on stdin (how the CLI executors start it)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
