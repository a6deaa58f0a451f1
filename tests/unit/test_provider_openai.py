"""OpenAIModel driving the real openai SDK against an httpx2.MockTransport."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest

from tests.support.provider_wire import (
    SEARCH,
    FakeProvider,
    completion,
    on_the_wire,
    search_transcript,
)
from worker.exceptions import ModelAuthError, ModelRequestError, ModelUnavailable
from worker.models import _openai
from worker.models._cache import PromptCache, agent_cache_key
from worker.models._openai import OpenAIModel
from worker.models._retry import RetryPolicy
from worker.models._types import Message, ModelRequest, StopReason, ToolCall

API_KEY = "sk-proj-secretsecretsecret0123456789"


@pytest.fixture(autouse=True)
def official_endpoint_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK reads OPENAI_BASE_URL when no base_url is given; these tests pick their own.
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def openai_model(fake: FakeProvider, name: str = "gpt-4o", **options: Any) -> OpenAIModel:
    """The SDK's model on ``fake``, with 2 retries that only record their pauses."""
    options.setdefault("retry", RetryPolicy(max_retries=2, jitter=False, sleep=fake.sleep))
    return OpenAIModel(name, api_key=API_KEY, http_client=fake.client(), **options)


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def error(status: int, text: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(status, json={"error": {"message": text, "type": "x"}}, headers=headers)


def ask(text: str = "hello", **options: Any) -> ModelRequest:
    options.setdefault("system", "You are terse.")
    return ModelRequest(messages=[Message(role="user", content=text)], **options)


@pytest.mark.anyio
async def test_text_answer_maps_text_usage_and_cost() -> None:
    fake = FakeProvider(
        completion(
            "Hi there",
            usage={
                "prompt_tokens": 3000,
                "completion_tokens": 400,
                "total_tokens": 3400,
                "prompt_tokens_details": {"cached_tokens": 1000},
            },
        )
    )
    response = await openai_model(fake, temperature=0.3).complete(ask())

    assert response.text == "Hi there"
    assert response.stop_reason is StopReason.END_TURN
    assert (response.provider, response.model, response.attempts) == (
        "openai",
        "gpt-4o-2024-08-06",
        1,
    )
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3000, 400)
    # gpt-4o: $2.50 input, $1.25 cached input, $10 output per million tokens.
    expected = (2000 * 2.5 + 1000 * 1.25 + 400 * 10.0) / 1_000_000
    assert response.usage.cost_usd == pytest.approx(expected)
    body = fake.body()
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
    ]
    assert body["temperature"] == 0.3
    assert body["max_completion_tokens"] == 4096
    assert "max_tokens" not in body
    assert "tools" not in body


@pytest.mark.anyio
async def test_compatible_servers_get_max_tokens() -> None:
    fake = FakeProvider(completion("ok"))
    await openai_model(fake, "llama3.1", base_url="http://ollama.local:11434/v1").complete(
        ask(max_output_tokens=77)
    )
    assert str(fake.requests[0].url) == "http://ollama.local:11434/v1/chat/completions"
    assert fake.body()["max_tokens"] == 77
    assert "max_completion_tokens" not in fake.body()


@pytest.mark.anyio
async def test_tool_use_request_and_answer() -> None:
    fake = FakeProvider(
        completion(
            None,
            tool_calls=[function_call("call_9", "hub__search", '{"q": "rq"}')],
            finish_reason="tool_calls",
        )
    )
    transcript = [
        Message(role="user", content="find rq posts"),
        Message(
            role="assistant",
            content="",
            tool_calls=(
                ToolCall(id="call_a", name="hub__search", arguments='{"q": "rq"}'),
                ToolCall(id="call_b", name="hub__get_post", arguments="{not json"),
            ),
        ),
        Message(role="tool", content="server down", tool_call_id="call_a", is_error=True),
        Message(role="tool", content="post p-1", tool_call_id="call_b"),
    ]
    response = await openai_model(fake).complete(
        ModelRequest(system="sys", messages=transcript, tools=[SEARCH])
    )

    assert response.stop_reason is StopReason.TOOL_USE
    assert response.text == ""
    assert response.tool_calls == (
        ToolCall(id="call_9", name="hub__search", arguments='{"q": "rq"}'),
    )
    body = fake.body()
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "hub__search",
                "description": "Search posts.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "find rq posts"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                function_call("call_a", "hub__search", '{"q": "rq"}'),
                function_call("call_b", "hub__get_post", "{not json"),
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "Error: server down"},
        {"role": "tool", "tool_call_id": "call_b", "content": "post p-1"},
    ]


@pytest.mark.anyio
async def test_malformed_tool_arguments_pass_through_raw() -> None:
    raw = '{"q": "rq", "limit": 5,,'
    fake = FakeProvider(
        completion(
            "", tool_calls=[function_call("call_1", "hub__search", raw)], finish_reason="tool_calls"
        )
    )
    response = await openai_model(fake).complete(ask())
    assert response.tool_calls[0].arguments == raw


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("finish_reason", "expected"),
    [
        ("stop", StopReason.END_TURN),
        ("tool_calls", StopReason.TOOL_USE),
        ("length", StopReason.MAX_TOKENS),
        ("content_filter", StopReason.REFUSAL),
        ("something_new", StopReason.OTHER),
    ],
)
async def test_finish_reasons(finish_reason: str, expected: StopReason) -> None:
    fake = FakeProvider(completion("x", finish_reason=finish_reason))
    response = await openai_model(fake).complete(ask())
    assert response.stop_reason is expected


@pytest.mark.anyio
async def test_refusal_and_tool_calls_reported_as_stop() -> None:
    refused = FakeProvider(completion(None, refusal="I can't help with that."))
    response = await openai_model(refused).complete(ask())
    assert response.stop_reason is StopReason.REFUSAL
    assert response.text == "I can't help with that."

    # Some compatible servers say "stop" although the model called a tool.
    compat = FakeProvider(completion("", tool_calls=[function_call("c1", "hub__search", "{}")]))
    assert (await openai_model(compat).complete(ask())).stop_reason is StopReason.TOOL_USE


@pytest.mark.anyio
async def test_429_is_retried_after_retry_after_ms() -> None:
    fake = FakeProvider(
        error(429, "rate limited", headers={"retry-after-ms": "1500", "retry-after": "9"}),
        completion("done"),
    )
    response = await openai_model(fake).complete(ask())
    assert response.text == "done"
    assert response.attempts == 2
    assert fake.sleeps == [1.5]


@pytest.mark.anyio
async def test_503_until_retries_run_out_raises_model_unavailable() -> None:
    fake = FakeProvider(
        error(503, "busy"), error(503, "busy"), error(503, "busy", headers={"retry-after": "3"})
    )
    with pytest.raises(ModelUnavailable) as caught:
        await openai_model(fake).complete(ask())
    assert len(fake.requests) == 3
    assert fake.sleeps == [0.5, 1.0]
    assert caught.value.retry_after_s == 3.0
    assert (caught.value.provider, caught.value.model) == ("openai", "gpt-4o")


@pytest.mark.anyio
async def test_timeout_errors_are_retried() -> None:
    fake = FakeProvider(httpx2.ReadTimeout("slow"), completion("ok"))
    response = await openai_model(fake).complete(ask())
    assert response.attempts == 2


@pytest.mark.anyio
async def test_401_raises_auth_error_without_the_key() -> None:
    echoed = "Incorrect API key provided: sk-proj-****************6789. Check your key."
    fake = FakeProvider(error(401, f"{echoed} ({API_KEY})"))
    with pytest.raises(ModelAuthError) as caught:
        await openai_model(fake).complete(ask())
    assert len(fake.requests) == 1
    assert API_KEY not in caught.value.message
    assert "6789" not in caught.value.message
    assert "openai model 'gpt-4o'" in caught.value.message


@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 404, 422])
async def test_invalid_request_raises_request_error(status: int) -> None:
    fake = FakeProvider(error(status, "bad request"))
    with pytest.raises(ModelRequestError, match=f"HTTP {status}"):
        await openai_model(fake).complete(ask())
    assert len(fake.requests) == 1


@pytest.mark.anyio
async def test_timeout_is_the_remaining_budget() -> None:
    fake = FakeProvider(completion("x"))
    await openai_model(fake, default_timeout_s=60.0).complete(ask(timeout_s=12.0))
    assert fake.requests[0].extensions["timeout"]["read"] == pytest.approx(12.0, abs=0.5)


@pytest.mark.anyio
async def test_unknown_model_has_unknown_cost() -> None:
    fake = FakeProvider(completion("x", model="qwen2.5:7b"))
    response = await openai_model(fake, "qwen2.5:7b", base_url="http://vllm.local/v1").complete(
        ask()
    )
    assert response.usage.cost_usd is None
    assert response.usage.total_tokens == 15


@pytest.mark.anyio
async def test_response_schema_becomes_a_strict_json_schema_format() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fake = FakeProvider(completion('{"ok": true}'))
    await openai_model(fake).complete(ask(response_schema=schema, response_schema_name="Verdict"))
    assert fake.body()["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Verdict", "schema": schema, "strict": True},
    }


@pytest.mark.anyio
async def test_the_request_is_the_one_the_sdks_create_sends() -> None:
    # The model posts its body through the SDK's ``post`` (no TypedDict transform): the same
    # method, URL, headers (the key as bearer) and body as ``chat.completions.create``.
    transcript = search_transcript("call_a")
    fake = FakeProvider(completion("done"), completion("done"))
    model = openai_model(fake, temperature=0.2)
    await model.complete(
        ModelRequest(
            system="sys",
            messages=transcript,
            tools=[SEARCH],
            timeout_s=30.0,
            response_schema={"type": "object"},
            response_schema_name="answer",
        )
    )
    sdk = openai.AsyncOpenAI(
        api_key=API_KEY,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handle)),
    )
    body = fake.body()
    await sdk.chat.completions.create(
        model=body["model"],
        messages=body["messages"],
        tools=body["tools"],
        temperature=body["temperature"],
        max_completion_tokens=body["max_completion_tokens"],
        response_format=body["response_format"],
        timeout=30.0,
    )

    ours, theirs = on_the_wire(fake.requests[0]), on_the_wire(fake.requests[1])
    assert ours == theirs
    assert ours[2]["authorization"] == f"Bearer {API_KEY}"
    assert ours[1] == "https://api.openai.com/v1/chat/completions"


@pytest.mark.anyio
async def test_the_agents_cache_key_is_sent_and_the_tasks_line_opens_the_first_message() -> None:
    fake = FakeProvider(completion("done"), completion("done"))
    model = openai_model(fake, prompt_cache=PromptCache(key=agent_cache_key("reviewer")))
    await model.complete(ask(system="You review.", system_context="Budget: $0.10 of $1.00."))
    body = fake.body()
    assert body["prompt_cache_key"] == agent_cache_key("reviewer")
    assert body["prompt_cache_key"] != agent_cache_key("writer")
    assert "reviewer" not in body["prompt_cache_key"]
    # The system message holds only the agent's prompt (chat templates put the tools after
    # it); the task's line opens the first user message, which every template accepts.
    assert body["messages"] == [
        {"role": "system", "content": "You review."},
        {"role": "user", "content": "Budget: $0.10 of $1.00.\n\nhello"},
    ]
    # Without the cache: one system text, as before.
    await openai_model(fake, prompt_cache=None).complete(
        ask(system="You review.", system_context="Budget: $0.10 of $1.00.")
    )
    assert fake.body(1)["messages"][0] == {
        "role": "system",
        "content": "You review.\n\nBudget: $0.10 of $1.00.",
    }


@pytest.mark.anyio
async def test_a_closing_call_lists_the_tools_and_lets_the_model_call_none() -> None:
    fake = FakeProvider(completion("step"), completion("closing"))
    model = openai_model(fake, prompt_cache=PromptCache(key="agent-x"))
    await model.complete(ask(tools=[SEARCH]))
    await model.complete(ask(tools=[SEARCH], tools_callable=False, last_call=True))
    step, closing = fake.body(0), fake.body(1)
    assert closing["tools"] == step["tools"]
    assert "tool_choice" not in step
    assert closing["tool_choice"] == "none"


@pytest.mark.anyio
async def test_no_cache_key_when_the_cache_is_off_or_the_operator_opts_out() -> None:
    fake = FakeProvider(completion("a"), completion("b"))
    await openai_model(fake, prompt_cache=None).complete(ask())
    await openai_model(fake, prompt_cache=PromptCache(key="agent-x", send_key=False)).complete(
        ask()
    )
    assert "prompt_cache_key" not in fake.body(0)
    assert "prompt_cache_key" not in fake.body(1)


@pytest.mark.anyio
async def test_a_server_refusing_the_cache_key_is_asked_again_without_it_and_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_openai, "_REFUSE_CACHE_KEY", set())
    refusal = error(400, "Unrecognized request argument supplied: prompt_cache_key")
    fake = FakeProvider(refusal, completion("first"), completion("second"))
    model = openai_model(
        fake, base_url="http://llm.internal/v1", prompt_cache=PromptCache(key="agent-x")
    )
    assert (await model.complete(ask())).text == "first"
    assert (await model.complete(ask())).text == "second"
    sent = [fake.body(i).get("prompt_cache_key") for i in range(3)]
    assert sent == ["agent-x", None, None]
    assert fake.sleeps == []  # not a retry of the call: the same attempt, reshaped


@pytest.mark.anyio
async def test_another_400_is_not_retried_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_openai, "_REFUSE_CACHE_KEY", set())
    fake = FakeProvider(error(400, "messages: too many"))
    model = openai_model(fake, prompt_cache=PromptCache(key="agent-x"))
    with pytest.raises(ModelRequestError):
        await model.complete(ask())
    assert len(fake.requests) == 1
