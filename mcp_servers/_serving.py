"""Run one of our MCP servers from the command line: streamable HTTP at ``/mcp`` or stdio.

Every server module ends with ``serve(server, default_port=...)``. Over HTTP, a set
``MCP_AUTH_TOKEN`` makes every request without ``Authorization: Bearer <token>`` a 401;
stdio is a private pipe to the parent process and needs no token. Each tool call goes
through ``logged_tool_call``, which asks the server's ``Identity`` who may call (the signed
capability when ``CAPABILITY_KEY`` is set; a warning at start when it is not). Logs are one
JSON object per line on stderr, and never carry the token, the Hub key or the capability key.
"""

from __future__ import annotations

import argparse
import hmac
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from types import FrameType
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from opentelemetry import trace
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_servers._identity import CAPABILITY_KEY_ENV, Caller, Identity, identity_from_env
from mcp_servers._tracing import skip_untraced_set_up
from worker.exceptions import ConfigurationError
from worker.tracing import configure_tracing, flush_spans

DEFAULT_HOST = "127.0.0.1"
MCP_PATH = "/mcp"
AUTH_TOKEN_ENV = "MCP_AUTH_TOKEN"
# Values of these variables are scrubbed from every log line, whatever logged them.
SECRET_ENV_VARS = (AUTH_TOKEN_ENV, "HUB_API_KEY", CAPABILITY_KEY_ENV)
# Open SSE streams would otherwise hold a shutdown forever.
GRACEFUL_SHUTDOWN_S = 5
# After SIGTERM over stdio: time for cancelled calls to unwind before the process leaves.
STDIO_EXIT_GRACE_S = 1.0
# How long a leaving stdio server waits for its last spans to be exported.
SPAN_FLUSH_TIMEOUT_S = 2.0

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_QUIET_LOGGERS = ("httpx2", "httpcore2", "uvicorn.access")

logger = logging.getLogger("mcp_servers")


def serve(
    server: MCPServer[Any],
    *,
    default_port: int,
    argv: Sequence[str] | None = None,
    options: argparse.Namespace | None = None,
) -> None:
    """Serve until stdin closes (stdio) or SIGINT/SIGTERM arrives (HTTP and stdio).

    ``options`` are already parsed arguments from ``argument_parser`` (for a server
    with options of its own); otherwise ``argv`` (default ``sys.argv[1:]``) is parsed.
    """
    if options is None:
        options = argument_parser(server.name, default_port).parse_args(argv)
    auth_token = os.environ.get(AUTH_TOKEN_ENV) or None
    configure_json_logging(secrets=[os.environ.get(name, "") for name in SECRET_ENV_VARS])
    configure_tracing_or_exit(f"mcp-{server.name}")
    skip_untraced_set_up(server)
    if not os.environ.get(CAPABILITY_KEY_ENV):
        log_event(
            "identity_unverified",
            level=logging.WARNING,
            server=server.name,
            hint=f"set {CAPABILITY_KEY_ENV} (as on the workers) so only a signed per-task "
            "capability can act for an agent; without it any caller holding the bearer "
            "token can name any agent in _meta",
        )
    if options.stdio:
        log_event("server_started", server=server.name, transport="stdio")
        anyio.run(_serve_stdio, server)
    else:
        _serve_http(server, host=options.host, port=options.port, auth_token=auth_token)
    log_event("server_stopped", server=server.name)


def argument_parser(name: str, default_port: int) -> argparse.ArgumentParser:
    """``--host``, ``--port`` and ``--stdio``; a server may add options of its own."""
    parser = argparse.ArgumentParser(
        prog=f"python -m mcp_servers.{name}",
        description=f"MCP server '{name}': streamable HTTP at {MCP_PATH}, or stdio. "
        f"Set {AUTH_TOKEN_ENV} to require a bearer token over HTTP.",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=default_port, help="port to bind (default: %(default)s)"
    )
    parser.add_argument("--stdio", action="store_true", help="serve over stdin/stdout instead")
    return parser


async def _serve_stdio(server: MCPServer[Any]) -> None:
    await serve_stdio_until_signalled(server.name, server.run_stdio_async)


async def serve_stdio_until_signalled(name: str, serve: Callable[[], Awaitable[None]]) -> None:
    """Run the stdio server ``serve`` until stdin closes, or SIGTERM/SIGINT; for every MCP
    server of ours over stdio (``name`` is logged when the process leaves)."""
    async with anyio.create_task_group() as task_group:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for received in signals:
                    log_event("signal_received", signal=signal.Signals(received).name)
                    # The SDK reads stdin in a thread that cancellation cannot interrupt:
                    # cancel the calls in flight, then leave without waiting for a line.
                    _exit_after(STDIO_EXIT_GRACE_S, name)
                    task_group.cancel_scope.cancel()
                    return

        task_group.start_soon(stop_on_signal)
        await serve()
        task_group.cancel_scope.cancel()


def _exit_after(delay_s: float, name: str) -> None:
    def leave() -> None:
        log_event("server_stopped", server=name)
        logging.shutdown()
        flush_spans(SPAN_FLUSH_TIMEOUT_S)  # os._exit skips the SDK's own flush at exit
        os._exit(0)

    timer = threading.Timer(delay_s, leave)
    timer.daemon = True
    timer.start()


def _serve_http(server: MCPServer[Any], *, host: str, port: int, auth_token: str | None) -> None:
    app = build_http_app(server, host=host, auth_token=auth_token)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,  # keep our JSON handler on the root logger
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    if host not in _LOOPBACK_HOSTS and auth_token is None:
        log_event(
            "insecure_bind",
            level=logging.WARNING,
            server=server.name,
            host=host,
            hint=f"set {AUTH_TOKEN_ENV} when binding beyond loopback",
        )
    log_event(
        "server_started",
        server=server.name,
        transport="streamable-http",
        url=f"http://{host}:{port}{MCP_PATH}",
        auth=auth_token is not None,
    )
    # uvicorn stops gracefully on SIGINT/SIGTERM and then re-raises the signal to the
    # handler that was installed before it: make that one a no-op so the exit is clean.
    with _signals_ignored_after_uvicorn():
        uvicorn.Server(config).run()


@contextmanager
def _signals_ignored_after_uvicorn() -> Iterator[None]:
    previous = {sig: signal.signal(sig, _note_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _note_signal(signum: int, frame: FrameType | None) -> None:
    log_event("signal_received", signal=signal.Signals(signum).name)


def build_http_app(server: MCPServer[Any], *, host: str, auth_token: str | None) -> ASGIApp:
    """The streamable-HTTP ASGI app at ``/mcp``, behind bearer auth when a token is given."""
    app: ASGIApp = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    return app if auth_token is None else BearerAuth(app, token=auth_token)


class BearerAuth:
    """ASGI middleware: answer 401 to any HTTP request without the right bearer token."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._authorized(scope):
            await self._app(scope, receive, send)
            return
        client = scope.get("client")
        log_event(
            "http_unauthorized",
            level=logging.WARNING,
            path=scope.get("path", ""),
            client=client[0] if client else None,
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {"error": "unauthorized", "detail": "missing or wrong bearer token"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="mcp"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        presented = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                presented = value
                break
        return hmac.compare_digest(presented, self._expected)


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts", "level", "event", ...}``, secrets scrubbed."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Short values would scrub ordinary words; real tokens and keys are long.
        self._secrets = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "log"),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["logger"] = record.name
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        entry.update(_trace_fields())
        line = json.dumps(entry, default=str, ensure_ascii=False)
        for secret in self._secrets:
            line = line.replace(secret, "[redacted]")
        return line


def _trace_fields() -> dict[str, str]:
    """``trace_id`` and ``span_id`` of a line written inside a span, so logs join traces."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    return {
        "trace_id": format(span_context.trace_id, "032x"),
        "span_id": format(span_context.span_id, "016x"),
    }


def configure_tracing_or_exit(service_name: str) -> None:
    """Traces as the OTEL_* variables ask (``service.name`` defaults to ``service_name``),
    or one clear line and exit 2 for an exporter nothing installed provides."""
    try:
        configure_tracing(service_name)
    except ConfigurationError as exc:
        print(f"mcp_servers: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


def configure_json_logging(*, secrets: Iterable[str] = (), level: int = logging.INFO) -> None:
    """Route every logger (ours, the SDK's, uvicorn's) to JSON lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter(secrets))
    # force: MCPServer() already called basicConfig with its own handler at import time.
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event; ``fields`` become top-level keys of the JSON line."""
    logger.log(level, event, extra={"event": event, "fields": fields})


def add_tools(server: MCPServer[Any], *tools: Callable[..., Awaitable[str]]) -> None:
    """Register tools whose cleaned docstring is the description the model reads.

    Tools return readable text, so no structured output schema is advertised.
    """
    for tool in tools:
        server.add_tool(tool, description=inspect.getdoc(tool), structured_output=False)


def identity_or_exit(name: str, tool_grants: dict[str, str]) -> Identity:
    """The server's Identity from the environment, or one clear line and exit 2."""
    try:
        return identity_from_env(os.environ, tool_grants)
    except ValueError as exc:
        print(f"mcp_servers.{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


class CallOutcome(StrEnum):
    """How a tool call ended, as its ``tool_call`` log line says."""

    OK = "ok"
    TOOL_ERROR = "tool_error"  # the tool refused it with a message for the model
    ERROR = "error"  # anything else the tool raised
    CANCELLED = "cancelled"  # the client cancelled the request

    @property
    def is_failure(self) -> bool:
        return self in (CallOutcome.TOOL_ERROR, CallOutcome.ERROR)


@contextmanager
def logged_tool_call(
    *, server: str, tool: str, identity: Identity, ctx: Context[Any, Any]
) -> Iterator[Caller | None]:
    """Check who calls (``Identity.caller``) and log one ``tool_call`` event (who, outcome,
    duration) around the tool's work; yields the caller."""
    started = time.monotonic()
    outcome = CallOutcome.ERROR
    caller: Caller | None = None
    try:
        caller = identity.caller(ctx, tool)
        yield caller
        outcome = CallOutcome.OK
    except ToolError:
        outcome = CallOutcome.TOOL_ERROR
        raise
    except anyio.get_cancelled_exc_class():
        # The client gave up on it (its deadline, the task stopped): no fault of the tool.
        outcome = CallOutcome.CANCELLED
        raise
    finally:
        log_event(
            "tool_call",
            level=logging.WARNING if outcome.is_failure else logging.INFO,
            server=server,
            tool=tool,
            agent=caller.agent_id if caller else None,
            task=caller.task_id if caller else None,
            outcome=outcome,
            duration_ms=round((time.monotonic() - started) * 1000),
        )
