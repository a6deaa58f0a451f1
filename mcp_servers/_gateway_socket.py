"""The gateway's Unix socket: how a sandboxed CLI's bridge reaches ``mcp_servers.gateway``.

Every connection is one MCP session, framed as over stdio: one JSON-RPC message per line,
at most ``MAX_MESSAGE_BYTES`` (a longer line ends the connection). The socket is the
only thing of the gateway the sandbox sees; its directory (0700, the sandbox's user)
guards it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import mcp_types
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.lowlevel import Server
from mcp.shared.message import SessionMessage

from worker.logs import log_event

# One JSON-RPC message over the socket; a longer line ends the connection.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
LifespanT = TypeVar("LifespanT")


async def serve_socket(server: Server[LifespanT], name: str, socket_path: Path) -> None:
    """Serve MCP (JSON-RPC lines, as over stdio) to every connection on a Unix socket,
    until SIGTERM/SIGINT: the channel a sandboxed CLI reaches the gateway through."""
    from mcp_servers._serving import serve_stdio_until_signalled  # only when serving

    listener = await anyio.create_unix_listener(socket_path)
    os.chmod(socket_path, 0o666)  # the sandbox user connects; the directory guards the socket
    log_event("gateway_listening", socket=str(socket_path))

    async def session(connection: anyio.abc.SocketStream) -> None:
        async with connection, socket_streams(connection) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    async def serve() -> None:
        async with listener:
            await listener.serve(session)

    await serve_stdio_until_signalled(name, serve)


@asynccontextmanager
async def socket_streams(
    connection: anyio.abc.ByteStream,
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The MCP session streams over one socket connection: a JSON-RPC message per line."""
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    lines = BufferedByteReceiveStream(connection)

    async def read_lines() -> None:
        async with read_writer:
            while True:
                try:
                    line = await lines.receive_until(b"\n", MAX_MESSAGE_BYTES)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                except anyio.DelimiterNotFound as exc:
                    await read_writer.send(ValueError(f"message over {MAX_MESSAGE_BYTES} bytes"))
                    raise anyio.BrokenResourceError from exc
                try:
                    message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError as exc:
                    await read_writer.send(exc)
                    continue
                await read_writer.send(SessionMessage(message))

    async def write_lines() -> None:
        async with write_reader:
            async for session_message in write_reader:
                text = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await connection.send(text.encode("utf-8") + b"\n")

    async with anyio.create_task_group() as pumps:
        pumps.start_soon(read_lines)
        pumps.start_soon(write_lines)
        yield read_stream, write_stream
        pumps.cancel_scope.cancel()
