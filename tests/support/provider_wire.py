"""What the provider tests share: the fake provider the real SDKs talk to and its answers
(``completion`` for OpenAI, ``message`` for Anthropic), a search tool, a
transcript that used it, and a request as it went on the wire (to compare the worker's
request with the SDK's own)."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import httpx2
import pytest

from worker.models import Message, ToolCall, ToolSpec
from worker.models import _factory as factory


class FakeProvider:
    """A provider's HTTP API for a real SDK, through ``httpx2.MockTransport``: answers each
    request with the next scripted response (an exception is raised instead, as the
    transport's failure); records what was sent and what a retry policy slept."""

    def __init__(self, *answers: httpx2.Response | Exception) -> None:
        self.answers: deque[httpx2.Response | Exception] = deque(answers)
        self.requests: list[httpx2.Request] = []
        self.sleeps: list[float] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        answer = self.answers.popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def sleep(self, seconds: float) -> None:
        """A ``RetryPolicy.sleep`` that only records the pause."""
        self.sleeps.append(seconds)

    def body(self, index: int = -1) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.requests[index].content)
        return body

    def client(self) -> httpx2.AsyncClient:
        """The HTTP client to give the SDK."""
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))


def completion(
    content: str | None = "",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    model: str = "gpt-4o-2024-08-06",
    usage: dict[str, Any] | None = None,
    refusal: str | None = None,
) -> httpx2.Response:
    """An OpenAI chat completion of ``content`` (and ``tool_calls``)."""
    answer: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls is not None:
        answer["tool_calls"] = tool_calls
    return httpx2.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "message": answer, "finish_reason": finish_reason}],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        },
    )


def message(
    content: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    model: str = "claude-sonnet-4-5-20250929",
    usage: dict[str, int] | None = None,
) -> httpx2.Response:
    """An Anthropic message of ``content`` blocks."""
    return httpx2.Response(
        200,
        json={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "usage": usage or {"input_tokens": 10, "output_tokens": 5},
        },
    )


def answering_every_request(
    monkeypatch: pytest.MonkeyPatch, status: int, error: str
) -> list[httpx2.Request]:
    """The model factory's HTTP client answering every request ``status``, with ``error`` as
    the provider's error message; the requests its models send, in order."""
    sent: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(status, json={"error": {"message": error}})

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(handle))
    monkeypatch.setattr(factory, "shared_http_client", lambda *_: client)
    return sent


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
