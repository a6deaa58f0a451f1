"""MCP server ``gateway``: one task's granted tools, for a coding-agent CLI.

Run by the CLI itself (claude-code, opencode, goose), as its only MCP server:
``python -m mcp_servers.gateway --stdio``. Everything it needs comes from the
environment block the CLI executor wrote (``worker.executors._gateway_link``):
the agent and task, the effective grants, the task's ``allowed_tools``,
``MCP_CONFIG``, and a file with ``MCP_AUTH_TOKEN`` and the tool credentials.
Nothing comes from the model.

It connects to the configured servers through the worker's own grant-checked
``McpToolbox``, offers only the tools the agent may use (``<server>__<tool>``
with their input schemas), and runs every call through the same dispatcher as
the native loop: an unknown tool answers ``Error: Unknown tool '<name>'``, a tool
without its grant ``Error: Missing grant <grant>`` (never executed; logged as
``grant_denied`` on stderr), arguments that do not match the schema are refused,
and the rest is forwarded with the worker's ``_meta`` identity (``agent_id``,
``task_id``, ``idempotency_key = <task_id>:tool:<n>:1`` for the n-th call).
Each call is also written to the call log the executor reads after the run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from mcp_servers._serving import STDIO_EXIT_GRACE_S, _exit_after
from worker.exceptions import ConfigurationError
from worker.executors._gateway_link import (
    MCP_AUTH_TOKEN,
    CallLogWriter,
    GatewaySpec,
    read_secrets_file,
)
from worker.logs import log_event, set_redactor
from worker.loop import EventBus, GrantDenied, LoopEvent, ToolDispatcher
from worker.models import ToolCall
from worker.redaction import process_redactor
from worker.tools._config import McpConfig, load_mcp_config
from worker.tools._grants import EffectiveGrants
from worker.tools._mcp import McpToolbox

SERVER_NAME = "gateway"


@dataclass(eq=False)
class Gateway:
    """The open toolbox of one task and the dispatcher every call goes through."""

    spec: GatewaySpec
    toolbox: McpToolbox
    dispatcher: ToolDispatcher
    call_log: CallLogWriter
    calls: itertools.count[int]

    def tools(self) -> list[mcp_types.Tool]:
        return [
            mcp_types.Tool(
                name=spec.name, description=spec.description, input_schema=spec.input_schema
            )
            for spec in self.toolbox.offered()
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        step = next(self.calls)
        call = ToolCall(id=f"gateway-{step}", name=name, arguments=json.dumps(arguments))
        remaining_s = self.spec.deadline_epoch_s - time.time()
        timeout_s = max(0.001, min(remaining_s, self.spec.tool_timeout_s))
        record = await self.dispatcher.run(step, 1, call, timeout_s)
        self.call_log.tool_call(step, record)
        if record.outcome == "missing_grant" and self.spec.strict_grants:
            # The executor ends the task when it reads this; the call itself never ran.
            self.call_log.autonomy_violation(
                step,
                f"agent {self.spec.agent_id!r} called {name!r} without its grant (strict grants)",
            )
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(text=record.content)], is_error=record.is_error
        )


def build_server(spec: GatewaySpec, config: McpConfig) -> Server[Gateway]:
    """The gateway as a low-level MCP server: its tool list is only known once connected."""

    @asynccontextmanager
    async def open_gateway(_: Server[Gateway]) -> AsyncIterator[Gateway]:
        call_log = CallLogWriter(spec.call_log)
        call_log.started(os.getpid())
        events = EventBus([lambda event: _log_denial(call_log, event)])
        try:
            async with McpToolbox.open(
                config,
                grants=EffectiveGrants(
                    allowed=frozenset(spec.grants), denied=frozenset(spec.denied_grants)
                ),
                allowed_tools=spec.allowed_tools,
                servers=spec.servers or None,
                auth_token=os.environ.get(MCP_AUTH_TOKEN) or None,
                on_spawn=call_log.spawned,
            ) as toolbox:
                yield Gateway(
                    spec=spec,
                    toolbox=toolbox,
                    dispatcher=ToolDispatcher(
                        toolbox,
                        task_id=spec.task_id,
                        agent_id=spec.agent_id,
                        events=events,
                        # Strictness is the executor's to enforce: the call log tells it.
                        strict_grants=False,
                        max_output_chars=spec.max_output_chars,
                    ),
                    call_log=call_log,
                    calls=itertools.count(1),
                )
        finally:
            call_log.close()

    async def list_tools(
        ctx: ServerRequestContext[Gateway], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=ctx.lifespan_context.tools())

    async def call_tool(
        ctx: ServerRequestContext[Gateway], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        return await ctx.lifespan_context.call(params.name, params.arguments or {})

    return Server(
        SERVER_NAME,
        version="1",
        instructions="The tools this agent holds grants for, on behalf of the Hub worker.",
        lifespan=open_gateway,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _log_denial(call_log: CallLogWriter, event: LoopEvent) -> None:
    if isinstance(event, GrantDenied):
        call_log.grant_denied(event.step, event.tool, event.required_grant)


async def serve_stdio(server: Server[Gateway]) -> None:
    """Serve until stdin closes, or SIGTERM/SIGINT (the calls in flight are cancelled)."""
    async with anyio.create_task_group() as task_group:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for received in signals:
                    log_event("signal_received", signal=signal.Signals(received).name)
                    # stdin is read in a thread cancellation cannot interrupt.
                    _exit_after(STDIO_EXIT_GRACE_S, SERVER_NAME)
                    task_group.cancel_scope.cancel()
                    return

        task_group.start_soon(stop_on_signal)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        task_group.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mcp_servers.gateway",
        description="One task's grant-checked tools for a coding-agent CLI, over stdio. "
        "Configured by the CLI executor through GATEWAY_* environment variables.",
    )
    parser.add_argument("--stdio", action="store_true", required=True, help="serve over stdio")
    parser.parse_args(argv)
    secrets: dict[str, str] = {}
    try:
        spec = GatewaySpec.from_environment(os.environ)
        if spec.secrets_file is not None:
            secrets = read_secrets_file(spec.secrets_file)
            os.environ.update(secrets)
        if spec.workdir is not None:
            os.chdir(spec.workdir)
        config = load_mcp_config(spec.mcp_config)
    except ConfigurationError as exc:
        print(f"mcp_servers.gateway: {exc.message}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"mcp_servers.gateway: {exc}", file=sys.stderr)
        return 2
    set_redactor(process_redactor(secrets.values()))
    log_event("server_started", server=SERVER_NAME, transport="stdio", task=spec.task_id)
    anyio.run(serve_stdio, build_server(spec, config))
    log_event("server_stopped", server=SERVER_NAME, task=spec.task_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
