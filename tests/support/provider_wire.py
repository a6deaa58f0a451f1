"""What the provider tests share: a search tool, a transcript that used it, and a request as
it went on the wire (to compare the worker's request with the SDK's own)."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from worker.models import Message, ToolCall, ToolSpec

SEARCH = ToolSpec(
    name="hub__search",
    description="Search posts.",
    input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
)


def search_transcript(call_id: str, *, preamble: str = "") -> list[Message]:
    """A user's ask, the model's search for it, and the search's result."""
    call = ToolCall(id=call_id, name="hub__search", arguments='{"q": "rq"}')
    return [
        Message(role="user", content="find rq posts"),
        Message(role="assistant", content=preamble, tool_calls=(call,)),
        Message(role="tool", content="post p-1", tool_call_id=call_id),
    ]


def on_the_wire(request: httpx2.Request) -> tuple[str, str, dict[str, str], dict[str, Any]]:
    """Method, URL, headers and body, without the headers that differ between any two
    requests by design (the retry count, the time left of the timeout)."""
    varying = {"x-stainless-retry-count", "x-stainless-read-timeout", "x-stainless-timeout"}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in varying}
    return request.method, str(request.url), headers, json.loads(request.content)
