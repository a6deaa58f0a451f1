"""AnthropicModel driving the real anthropic SDK against an httpx2.MockTransport."""

from __future__ import annotations

import dataclasses
from typing import Any

import anthropic
import httpx2
import pytest

from tests.support.provider_wire import (
    SEARCH,
    FakeProvider,
    message,
    on_the_wire,
    search_transcript,
)
from worker.exceptions import ModelAuthError, ModelRequestError, ModelUnavailable
from worker.models._anthropic import AnthropicModel
from worker.models._cache import PromptCache
from worker.models._retry import RetryPolicy
from worker.models._types import Message, ModelRequest, StopReason, ToolCall, ToolSpec

API_KEY = "sk-ant-api03-secret-test-key-0123456789"


def anthropic_model(
    fake: FakeProvider, name: str = "claude-sonnet-4-5", **options: Any
) -> AnthropicModel:
    """The SDK's model on ``fake``, with 3 retries that only record their pauses."""
    options.setdefault("retry", RetryPolicy(max_retries=3, jitter=False, sleep=fake.sleep))
    return AnthropicModel(name, api_key=API_KEY, http_client=fake.client(), **options)


def error(status: int, text: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    body = {"type": "error", "error": {"type": "some_error", "message": text}}
    return httpx2.Response(status, json=body, headers=headers)


def ask(text: str = "hello", **options: Any) -> ModelRequest:
    return ModelRequest(
        system="You are terse.", messages=[Message(role="user", content=text)], **options
    )


@pytest.mark.anyio
async def test_text_answer_maps_text_usage_and_cost() -> None:
    fake = FakeProvider(
        message(
            [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
            usage={
                "input_tokens": 1000,
                "output_tokens": 500,
                "cache_read_input_tokens": 2000,
                "cache_creation_input_tokens": 400,
            },
        )
    )
    response = await anthropic_model(fake, max_output_tokens=321).complete(ask())

    assert response.text == "Hi there"
    assert response.tool_calls == ()
    assert response.stop_reason is StopReason.END_TURN
    assert (response.provider, response.model, response.attempts) == (
        "anthropic",
        "claude-sonnet-4-5-20250929",
        1,
    )
    assert response.usage.input_tokens == 3400  # fresh + cache read + cache creation
    assert response.usage.output_tokens == 500
    # $3 fresh, $0.30 cache read, $3.75 cache write, $15 output per million tokens.
    expected = (1000 * 3.0 + 2000 * 0.3 + 400 * 3.75 + 500 * 15.0) / 1_000_000
    assert response.usage.cost_usd == pytest.approx(expected)
    body = fake.body()
    assert body["model"] == "claude-sonnet-4-5"
    assert body["max_tokens"] == 321
    assert body["system"] == "You are terse."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert "tools" not in body
    assert fake.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


@pytest.mark.anyio
async def test_temperature_is_never_sent_because_the_api_rejects_it() -> None:
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]))
    await anthropic_model(fake, temperature=0.2).complete(ask(temperature=0.7))
    assert "temperature" not in fake.body()


@pytest.mark.anyio
async def test_tool_use_request_and_answer() -> None:
    fake = FakeProvider(
        message(
            [
                {"type": "text", "text": "Searching."},
                {"type": "tool_use", "id": "toolu_2", "name": "hub__search", "input": {"q": "rq"}},
            ],
            stop_reason="tool_use",
        )
    )
    search = ToolSpec(
        name="hub__search",
        description="Search posts.",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    transcript = [
        Message(role="user", content="find rq posts"),
        Message(
            role="assistant",
            content="Two lookups.",
            tool_calls=(
                ToolCall(id="toolu_a", name="hub__search", arguments='{"q": "rq"}'),
                ToolCall(id="toolu_b", name="hub__get_post", arguments="{not json"),
            ),
        ),
        Message(role="tool", content="Error: server down", tool_call_id="toolu_a", is_error=True),
        Message(role="tool", content="post p-1", tool_call_id="toolu_b"),
        Message(role="user", content="also check comments"),
    ]
    response = await anthropic_model(fake).complete(
        ModelRequest(system="sys", messages=transcript, tools=[search])
    )

    assert response.stop_reason is StopReason.TOOL_USE
    assert response.text == "Searching."
    assert response.tool_calls == (
        ToolCall(id="toolu_2", name="hub__search", arguments='{"q": "rq"}'),
    )
    body = fake.body()
    assert body["system"] == "sys"
    assert body["tools"] == [
        {
            "name": "hub__search",
            "description": "Search posts.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "find rq posts"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Two lookups."},
                {"type": "tool_use", "id": "toolu_a", "name": "hub__search", "input": {"q": "rq"}},
                {
                    "type": "tool_use",
                    "id": "toolu_b",
                    "name": "hub__get_post",
                    "input": {"_unparsed_arguments": "{not json"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a",
                    "content": "Error: server down",
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "post p-1"},
                {"type": "text", "text": "also check comments"},
            ],
        },
    ]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        ("end_turn", StopReason.END_TURN),
        ("stop_sequence", StopReason.END_TURN),
        ("tool_use", StopReason.TOOL_USE),
        ("max_tokens", StopReason.MAX_TOKENS),
        ("model_context_window_exceeded", StopReason.MAX_TOKENS),
        ("refusal", StopReason.REFUSAL),
        ("pause_turn", StopReason.OTHER),
    ],
)
async def test_stop_reasons(stop_reason: str, expected: StopReason) -> None:
    fake = FakeProvider(message([{"type": "text", "text": "x"}], stop_reason=stop_reason))
    response = await anthropic_model(fake).complete(ask())
    assert response.stop_reason is expected


@pytest.mark.anyio
async def test_429_is_retried_after_the_retry_after_header() -> None:
    fake = FakeProvider(
        error(429, "rate limited", headers={"retry-after": "7"}),
        message([{"type": "text", "text": "finally"}]),
    )
    response = await anthropic_model(fake).complete(ask())
    assert response.text == "finally"
    assert response.attempts == 2
    assert fake.sleeps == [7.0]
    assert len(fake.requests) == 2


@pytest.mark.anyio
async def test_5xx_until_retries_run_out_raises_model_unavailable() -> None:
    fake = FakeProvider(*(error(status, "overloaded") for status in (500, 529, 503, 502)))
    with pytest.raises(ModelUnavailable) as caught:
        await anthropic_model(fake).complete(ask())
    assert len(fake.requests) == 4  # one request per attempt: the SDK's own retries are off
    assert fake.sleeps == [0.5, 1.0, 2.0]
    assert caught.value.provider == "anthropic"
    assert caught.value.model == "claude-sonnet-4-5"
    assert "4 attempts" in caught.value.message
    assert "HTTP 502" in caught.value.message


@pytest.mark.anyio
async def test_connection_errors_are_retried() -> None:
    fake = FakeProvider(
        httpx2.ConnectError("connection refused"), message([{"type": "text", "text": "back"}])
    )
    response = await anthropic_model(fake).complete(ask())
    assert response.text == "back"
    assert response.attempts == 2


@pytest.mark.anyio
async def test_401_raises_auth_error_without_the_key() -> None:
    fake = FakeProvider(error(401, f"invalid x-api-key {API_KEY}"))
    with pytest.raises(ModelAuthError) as caught:
        await anthropic_model(fake).complete(ask())
    assert len(fake.requests) == 1
    assert API_KEY not in caught.value.message
    assert "anthropic" in caught.value.message
    assert "claude-sonnet-4-5" in caught.value.message


@pytest.mark.anyio
async def test_400_raises_request_error_at_once() -> None:
    fake = FakeProvider(error(400, "messages: roles must alternate"))
    with pytest.raises(ModelRequestError, match="roles must alternate"):
        await anthropic_model(fake).complete(ask())
    assert len(fake.requests) == 1
    assert fake.sleeps == []


@pytest.mark.anyio
@pytest.mark.parametrize(("remaining", "expected"), [(30.0, 30.0), (None, 120.0), (500.0, 120.0)])
async def test_timeout_is_the_remaining_budget_capped_by_the_default(
    remaining: float | None, expected: float
) -> None:
    fake = FakeProvider(message([{"type": "text", "text": "x"}]))
    await anthropic_model(fake, default_timeout_s=120.0).complete(ask(timeout_s=remaining))
    timeouts = fake.requests[0].extensions["timeout"]
    assert timeouts["read"] == pytest.approx(expected, abs=0.5)
    assert timeouts["connect"] == pytest.approx(expected, abs=0.5)


@pytest.mark.anyio
async def test_retry_after_longer_than_the_budget_stops_at_once() -> None:
    fake = FakeProvider(error(429, "slow down", headers={"retry-after": "45"}))
    with pytest.raises(ModelUnavailable) as caught:
        await anthropic_model(fake, retry=RetryPolicy(max_delay_s=60.0, sleep=fake.sleep)).complete(
            ask(timeout_s=20.0)
        )
    assert fake.sleeps == []
    assert caught.value.retry_after_s == 45.0
    assert "remaining budget" in caught.value.message


@pytest.mark.anyio
async def test_unknown_model_has_unknown_cost() -> None:
    fake = FakeProvider(message([{"type": "text", "text": "x"}], model="claude-internal-test"))
    response = await anthropic_model(fake, "claude-internal-test").complete(ask())
    assert response.usage.cost_usd is None
    assert response.usage.input_tokens == 10


@pytest.mark.anyio
async def test_response_schema_uses_the_structured_output_config() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fake = FakeProvider(message([{"type": "text", "text": '{"ok": true}'}]))
    await anthropic_model(fake).complete(ask(response_schema=schema))
    assert fake.body()["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


# Long enough for Sonnet 4.5's minimum (1,024 tokens) at the layout's 3 characters a token.
AGENT_PROMPT = "You are a careful reviewer of release notes. " * 80
TRANSCRIPT = search_transcript("toolu_a", preamble="Looking.")


def cached_request(**options: Any) -> ModelRequest:
    options.setdefault("messages", TRANSCRIPT)
    options.setdefault("tools", [SEARCH])
    return ModelRequest(
        system=AGENT_PROMPT, system_context="Budget: $0.10 of $1.00 used today.", **options
    )


def marks(body: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """Where the body asks for cache breakpoints, in the order the API reads them."""
    found = [
        (f"tool {tool['name']}", tool["cache_control"])
        for tool in body.get("tools", [])
        if "cache_control" in tool
    ]
    system = body.get("system", [])
    if isinstance(system, list):
        found += [
            (f"system {i}", block["cache_control"])
            for i, block in enumerate(system)
            if "cache_control" in block
        ]
    for i, turn in enumerate(body["messages"]):
        found += [
            (f"turn {i} {block['type']}", block["cache_control"])
            for block in turn["content"]
            if "cache_control" in block
        ]
    return found


@pytest.mark.anyio
async def test_the_request_is_the_one_the_sdks_create_sends() -> None:
    # The model posts its encoded body through the SDK's ``post`` (no walk of the body): the
    # same method, URL, headers (the key) and body as ``messages.create`` with those fields.
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]), message([]))
    model = anthropic_model(fake, prompt_cache=PromptCache(key="k"))
    await model.complete(cached_request(timeout_s=30.0, response_schema={"type": "object"}))
    sdk = anthropic.AsyncAnthropic(
        api_key=API_KEY,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handle)),
    )
    body = fake.body()
    await sdk.messages.create(**body, timeout=30.0)

    ours, theirs = on_the_wire(fake.requests[0]), on_the_wire(fake.requests[1])
    assert ours == theirs
    assert ours[0] == "POST"
    assert ours[1] == "https://api.anthropic.com/v1/messages"
    assert ours[2]["authorization"] == f"Bearer {API_KEY}"
    assert marks(ours[3])  # the comparison covered a body with its breakpoints


@pytest.mark.anyio
async def test_the_cache_marks_the_tools_the_agents_prompt_and_the_conversation() -> None:
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]), message([]))
    model = anthropic_model(fake, prompt_cache=PromptCache(key="k"))
    await model.complete(cached_request())
    # One short tool is below Sonnet 4.5's 1,024 tokens on its own: not marked.
    assert [where for where, _ in marks(fake.body())] == [
        "system 0",
        "turn 0 text",
        "turn 2 tool_result",
    ]
    many = [
        dataclasses.replace(SEARCH, name=f"hub__search_{i}", description="Search. " * 60)
        for i in range(8)
    ]
    await model.complete(cached_request(tools=many))
    body = fake.body()
    ephemeral = {"type": "ephemeral"}
    assert marks(body) == [
        ("tool hub__search_7", ephemeral),
        ("system 0", ephemeral),
        # Where the previous call ended, and where this one ends.
        ("turn 0 text", ephemeral),
        ("turn 2 tool_result", ephemeral),
    ]
    # The agent's prompt is a block of its own; the task's line comes after it, unmarked.
    assert [block["text"] for block in body["system"]] == [
        AGENT_PROMPT,
        "Budget: $0.10 of $1.00 used today.",
    ]


@pytest.mark.anyio
async def test_an_hour_long_cache_covers_the_agent_and_five_minutes_the_conversation() -> None:
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]))
    await anthropic_model(fake, prompt_cache=PromptCache(ttl="1h")).complete(cached_request())
    hour, five_minutes = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral"}
    assert [mark for _, mark in marks(fake.body())] == [hour, five_minutes, five_minutes]


@pytest.mark.anyio
async def test_a_closing_call_marks_only_what_another_task_reads_back() -> None:
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]))
    await anthropic_model(fake, prompt_cache=PromptCache()).complete(cached_request(last_call=True))
    assert [where for where, _ in marks(fake.body())] == ["system 0"]


@pytest.mark.anyio
async def test_a_closing_call_keeps_the_tools_and_lets_the_model_call_none() -> None:
    # The tools open the cached prefix: a closing call without them would read nothing back.
    fake = FakeProvider(*(message([{"type": "text", "text": "ok"}]) for _ in range(3)))
    model = anthropic_model(fake, prompt_cache=PromptCache())
    await model.complete(cached_request())
    await model.complete(cached_request(tools_callable=False, last_call=True))
    step, closing = fake.body(0), fake.body(1)
    assert closing["tools"] == step["tools"]
    assert "tool_choice" not in step
    assert closing["tool_choice"] == {"type": "none"}
    # The same body through the SDK's own ``messages.create``: the field is one it knows.
    sdk = anthropic.AsyncAnthropic(
        api_key=API_KEY,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handle)),
    )
    await sdk.messages.create(**closing)
    assert on_the_wire(fake.requests[2])[3] == on_the_wire(fake.requests[1])[3]


@pytest.mark.anyio
async def test_a_prefix_below_the_models_minimum_is_not_marked() -> None:
    # Opus 4.5 caches nothing under 4,096 tokens: the agent's prompt (about 1,200) is not
    # marked, and a whole request that short is not marked anywhere.
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]), message([]))
    model = anthropic_model(fake, "claude-opus-4-5", prompt_cache=PromptCache())
    await model.complete(cached_request())
    assert marks(fake.body()) == []
    long_thread = Message(role="user", content="a long thread " * 1200)
    await model.complete(cached_request(messages=[long_thread]))
    assert [where for where, _ in marks(fake.body())] == ["turn 0 text"]


@pytest.mark.anyio
async def test_without_the_cache_the_request_is_todays() -> None:
    fake = FakeProvider(message([{"type": "text", "text": "ok"}]))
    await anthropic_model(fake, prompt_cache=None).complete(cached_request())
    body = fake.body()
    assert body["system"] == AGENT_PROMPT + "\n\nBudget: $0.10 of $1.00 used today."
    assert marks(body) == []


@pytest.mark.anyio
async def test_cache_tokens_are_reported_and_an_hours_write_costs_twice_the_input() -> None:
    usage = {
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_read_input_tokens": 3000,
        "cache_creation_input_tokens": 1000,
        "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 800},
    }
    fake = FakeProvider(message([{"type": "text", "text": "ok"}], usage=usage))
    response = await anthropic_model(fake, prompt_cache=PromptCache(ttl="1h")).complete(
        cached_request()
    )
    assert (response.usage.cache_read_tokens, response.usage.cache_write_tokens) == (3000, 1000)
    assert response.usage.input_tokens == 4100
    # $3 fresh, $0.30 read, $3.75 a 5-minute write, $6 an hour's write, $15 output per million.
    expected = (100 * 3.0 + 3000 * 0.3 + 200 * 3.75 + 800 * 6.0 + 10 * 15.0) / 1_000_000
    assert response.usage.cost_usd == pytest.approx(expected)
