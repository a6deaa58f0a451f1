"""The transports' bounds: framed stdio messages, oversized answers, stderr as log events."""

from __future__ import annotations

import io
import json

import anyio
import pytest
from mcp_types import JSONRPCError

from worker.tools._transports import (
    STDERR_BURST_LINES,
    STDERR_LINE_MAX_CHARS,
    StderrLog,
    _BoundedLines,
    _oversize_reply,
)

pytestmark = pytest.mark.anyio


async def lines_of(data: bytes, max_bytes: int) -> list[tuple[bytes | None, bytes]]:
    send, receive = anyio.create_memory_object_stream[bytes](100)
    # Arbitrary chunking: a message may span chunks and a chunk may hold several.
    for start in range(0, len(data), 7):
        await send.send(data[start : start + 7])
    send.close()
    reader = _BoundedLines(receive, max_bytes)  # type: ignore[arg-type]
    seen = []
    with pytest.raises(anyio.EndOfStream):
        while True:
            seen.append(await reader.receive())
    return seen


async def test_lines_within_the_bound_pass_and_a_longer_one_is_skipped_to_its_newline() -> None:
    long_line = b'{"jsonrpc":"2.0","id":7,"result":"' + b"x" * 500 + b'"}'
    seen = await lines_of(b"first\n" + long_line + b"\nafter\n", max_bytes=64)
    assert seen[0] == (b"first", b"")
    line, head = seen[1]
    assert line is None
    assert head.startswith(b'{"jsonrpc":"2.0","id":7')
    assert seen[2] == (b"after", b"")


@pytest.mark.parametrize(
    ("head", "request_id"),
    [(b'{"jsonrpc":"2.0","id":7,"result"', 7), (b'{"id": "req-1", "result"', "req-1")],
)
def test_an_oversized_answer_becomes_an_error_for_its_request(
    head: bytes, request_id: int | str
) -> None:
    reply = _oversize_reply(head, 1000)
    assert reply is not None
    assert isinstance(reply.message, JSONRPCError)
    assert reply.message.id == request_id
    assert "result larger than 1000 bytes (MCP_RESULT_MAX_BYTES)" in reply.message.error.message


def test_an_oversized_message_without_a_readable_id_gets_no_reply() -> None:
    assert _oversize_reply(b'{"jsonrpc":"2.0","result":"xxxx', 1000) is None


def test_a_secret_the_stderr_line_cut_falls_in_is_masked_whole(log_stream: io.StringIO) -> None:
    secret = "ghp-secret-value-1234567890"
    stderr = StderrLog("kit", {"GITHUB_TOKEN": secret})
    stderr.line("y" * (STDERR_LINE_MAX_CHARS - 10) + f" {secret} tail")
    (event,) = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert event["line"].endswith(" [redacted [cut]") and secret[:8] not in event["line"]


def test_stderr_lines_are_events_cut_masked_and_rate_limited(log_stream: io.StringIO) -> None:
    stderr = StderrLog("kit", {"GITHUB_TOKEN": "ghp-secret-value-1", "TZ": "UTC"})
    stderr.line("using ghp-secret-value-1 in UTC " + "z" * 5000)
    for _ in range(STDERR_BURST_LINES + 50):
        stderr.line("again")
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    first = events[0]
    assert (first["event"], first["server"]) == ("mcp_server_stderr", "kit")
    # Short values (TZ=UTC) are not masked: they would hide ordinary words.
    assert first["line"].startswith("using [redacted] in UTC z")
    assert first["line"].endswith(" [cut]")
    assert len(first["line"]) < 2100
    assert len(events) == STDERR_BURST_LINES
    assert stderr.dropped >= 50
