"""The scripted LLM endpoint, driven by the real OpenAI and Anthropic SDKs over HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import openai
import pytest

from tests.support.scripted_llm import ScriptedLlm, running_scripted_llm

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

USER_HI: list[Any] = [{"role": "user", "content": "hi"}]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HUB_TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "hub__search_posts": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    },
    "hub__get_thread": {
        "type": "object",
        "properties": {"post_id": {"type": "string"}},
        "required": ["post_id"],
    },
    "hub__create_post": {
        "type": "object",
        "properties": {
            "content": {"type": "string"},
            "title": {"type": "string"},
            "community": {"type": "string"},
        },
        "required": ["content"],
    },
    "hub__create_comment": {
        "type": "object",
        "properties": {"post_id": {"type": "string"}, "content": {"type": "string"}},
        "required": ["post_id", "content"],
    },
}


@pytest.fixture
def llm() -> Iterator[ScriptedLlm]:
    with running_scripted_llm() as endpoint:
        yield endpoint


@pytest.fixture
async def openai_client(llm: ScriptedLlm) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=llm.openai_base_url, api_key="sk-test-openai", max_retries=0
    ) as client:
        yield client


@pytest.fixture
async def anthropic_client(llm: ScriptedLlm) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=llm.anthropic_base_url, api_key="sk-ant-test", max_retries=0
    ) as client:
        yield client


# --- OpenAI Chat Completions -------------------------------------------------------------


async def test_openai_text_answer_with_scripted_usage(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.set_scenario(
        "default",
        [{"text": "Hello from the script", "usage": {"input_tokens": 42, "output_tokens": 7}}],
    )

    completion = await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)

    choice = completion.choices[0]
    assert choice.message.content == "Hello from the script"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (42, 7)
    assert completion.model == "gpt-test"


async def test_openai_tool_calls_keep_arguments_as_written(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.set_scenario(
        "default",
        [
            {
                "tool_calls": [
                    {"name": "get_weather", "arguments": {"city": "Paris"}},
                    {"name": "get_weather", "arguments": "{not json"},
                ]
            }
        ],
    )

    completion = await openai_client.chat.completions.create(
        model="gpt-test", messages=USER_HI, tools=[WEATHER_TOOL]
    )

    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [call.type for call in calls] == ["function", "function"]
    assert [c.function.name for c in calls if c.type == "function"] == ["get_weather"] * 2
    arguments = [c.function.arguments for c in calls if c.type == "function"]
    assert json.loads(arguments[0]) == {"city": "Paris"}
    assert arguments[1] == "{not json"
    assert len({call.id for call in calls}) == 2


async def test_openai_max_tokens_is_finish_reason_length(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.set_scenario("default", [{"text": "cut sh", "stop_reason": "max_tokens"}])

    completion = await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)

    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "cut sh"


async def test_openai_stream_delivers_text_and_tool_calls_as_deltas(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    arguments = {"city": "Lyon", "days": [1, 2, 3]}
    llm.set_scenario(
        "default",
        [
            {
                "text": "Let me look that up for you.",
                "tool_calls": [{"name": "get_weather", "arguments": arguments}],
                "usage": {"input_tokens": 11, "output_tokens": 13},
            }
        ],
    )

    stream = await openai_client.chat.completions.create(
        model="gpt-test",
        messages=USER_HI,
        tools=[WEATHER_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    text_pieces: list[str] = []
    argument_pieces: list[str] = []
    names: list[str] = []
    finish_reasons: list[str] = []
    usages: list[tuple[int, int]] = []
    async for chunk in stream:
        if chunk.usage is not None:
            usages.append((chunk.usage.prompt_tokens, chunk.usage.completion_tokens))
        for choice in chunk.choices:
            if choice.delta.content:
                text_pieces.append(choice.delta.content)
            for call in choice.delta.tool_calls or ():
                if call.function and call.function.name:
                    names.append(call.function.name)
                if call.function and call.function.arguments:
                    argument_pieces.append(call.function.arguments)
            if choice.finish_reason:
                finish_reasons.append(choice.finish_reason)

    assert "".join(text_pieces) == "Let me look that up for you."
    assert len(text_pieces) > 1, "text should arrive in several deltas"
    assert names == ["get_weather"]
    assert len(argument_pieces) > 1, "arguments should arrive in several deltas"
    assert json.loads("".join(argument_pieces)) == arguments
    assert finish_reasons == ["tool_calls"]
    assert usages == [(11, 13)]


async def test_openai_stream_helper_assembles_final_completion_without_usage_chunk(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.set_scenario(
        "default",
        [
            {
                "text": "Checking.",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
            }
        ],
    )

    async with openai_client.chat.completions.stream(
        model="gpt-test", messages=USER_HI, tools=[WEATHER_TOOL]
    ) as stream:
        final = await stream.get_final_completion()

    message = final.choices[0].message
    assert message.content == "Checking."
    assert final.choices[0].finish_reason == "tool_calls"
    calls = [c for c in message.tool_calls or () if c.type == "function"]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert final.usage is None, "no usage chunk unless stream_options.include_usage"


# --- Anthropic Messages ------------------------------------------------------------------


async def test_anthropic_text_and_tool_use(
    llm: ScriptedLlm, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    llm.set_scenario(
        "default",
        [
            {
                "text": "I will check.",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}],
                "usage": {"input_tokens": 30, "output_tokens": 4},
            },
            {"text": "It is sunny."},
        ],
    )

    first = await anthropic_client.messages.create(
        model="claude-test", max_tokens=100, messages=USER_HI
    )
    second = await anthropic_client.messages.create(
        model="claude-test", max_tokens=100, messages=USER_HI
    )

    assert first.stop_reason == "tool_use"
    assert [block.type for block in first.content] == ["text", "tool_use"]
    text_block, tool_block = first.content
    assert text_block.type == "text" and text_block.text == "I will check."
    assert tool_block.type == "tool_use"
    assert (tool_block.name, tool_block.input) == ("get_weather", {"city": "Rome"})
    assert tool_block.id.startswith("toolu_")
    assert (first.usage.input_tokens, first.usage.output_tokens) == (30, 4)
    assert second.stop_reason == "end_turn"
    assert [b.text for b in second.content if b.type == "text"] == ["It is sunny."]
    assert second.usage.input_tokens > 0 and second.usage.output_tokens > 0


async def test_anthropic_max_tokens_stop_reason(
    llm: ScriptedLlm, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    llm.set_scenario("default", [{"text": "trunc", "stop_reason": "max_tokens"}])

    message = await anthropic_client.messages.create(
        model="claude-test", max_tokens=5, messages=USER_HI
    )

    assert message.stop_reason == "max_tokens"


async def test_anthropic_stream_sends_the_real_event_sequence(
    llm: ScriptedLlm, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    llm.set_scenario(
        "default",
        [
            {
                "text": "Looking it up now.",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Bern", "n": 2}}],
                "usage": {"input_tokens": 21, "output_tokens": 9},
            }
        ],
    )

    stream = await anthropic_client.messages.create(
        model="claude-test", max_tokens=100, messages=USER_HI, stream=True
    )
    events = [event async for event in stream]

    kinds: list[str] = []
    for event in events:
        if not kinds or kinds[-1] != event.type:
            kinds.append(event.type)
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    text = "".join(d.text for d in deltas if d.type == "text_delta")
    partial_json = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    assert text == "Looking it up now."
    assert json.loads(partial_json) == {"city": "Bern", "n": 2}
    final_delta = next(e for e in events if e.type == "message_delta")
    assert final_delta.delta.stop_reason == "tool_use"
    assert final_delta.usage.output_tokens == 9
    start = next(e for e in events if e.type == "message_start")
    assert start.message.usage.input_tokens == 21


async def test_anthropic_stream_helper_and_beta_path(
    llm: ScriptedLlm, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    llm.set_scenario(
        "default",
        [
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Kyiv"}}]},
            {"text": "beta answer", "stop_reason": "max_tokens"},
        ],
    )

    async with anthropic_client.messages.stream(
        model="claude-test", max_tokens=100, messages=USER_HI
    ) as stream:
        final = await stream.get_final_message()
    # What Claude Code sends: the beta query flag, streaming.
    async with anthropic_client.messages.stream(
        model="claude-test", max_tokens=100, messages=USER_HI, extra_query={"beta": "true"}
    ) as beta_stream:
        beta = await beta_stream.get_final_message()

    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("get_weather", {"city": "Kyiv"})
    ]
    assert beta.stop_reason == "max_tokens"
    assert [b.text for b in beta.content if b.type == "text"] == ["beta answer"]
    paths = [(r["path"], r["query"]) for r in llm.requests()]
    assert paths == [("/v1/messages", ""), ("/v1/messages", "beta=true")]


async def test_model_list_reads_in_both_sdks(
    llm: ScriptedLlm,
    openai_client: openai.AsyncOpenAI,
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    llm.set_scenario("my-scenario", [])

    openai_models = await openai_client.models.list()
    anthropic_models = await anthropic_client.models.list()

    assert {m.id for m in openai_models.data} >= {"demo", "my-scenario"}
    assert {m.id for m in anthropic_models.data} >= {"demo", "my-scenario"}


# --- errors ------------------------------------------------------------------------------


async def test_429_turn_reaches_both_sdks_as_rate_limit_error_with_retry_after(
    llm: ScriptedLlm,
    openai_client: openai.AsyncOpenAI,
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    llm.set_scenario(
        "default",
        [
            {"status": 429, "headers": {"retry-after": "7"}},
            {"status": 429, "headers": {"retry-after": "3"}, "error": {"message": "slow down"}},
        ],
    )

    with pytest.raises(openai.RateLimitError) as openai_error:
        await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
    with pytest.raises(anthropic.RateLimitError) as anthropic_error:
        await anthropic_client.messages.create(model="c", max_tokens=10, messages=USER_HI)

    assert openai_error.value.status_code == 429
    assert openai_error.value.response.headers["retry-after"] == "7"
    assert anthropic_error.value.response.headers["retry-after"] == "3"
    assert "slow down" in anthropic_error.value.message
    assert anthropic_error.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }


async def test_error_turns_map_to_the_sdk_error_classes(
    llm: ScriptedLlm,
    openai_client: openai.AsyncOpenAI,
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    llm.set_scenario(
        "default",
        [
            {"status": 401, "error": {"message": "invalid x-api-key"}},
            {"status": 400, "error": {"message": "messages: bad"}},
            {"error": {"type": "api_error", "message": "boom"}},
        ],
    )

    with pytest.raises(anthropic.AuthenticationError, match="invalid x-api-key"):
        await anthropic_client.messages.create(model="c", max_tokens=10, messages=USER_HI)
    with pytest.raises(openai.BadRequestError, match="messages: bad"):
        await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
    with pytest.raises(openai.InternalServerError) as server_error:
        await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
    assert server_error.value.status_code == 500


async def test_malformed_model_requests_are_400_in_the_apis_own_shape(llm: ScriptedLlm) -> None:
    async with httpx2.AsyncClient(base_url=llm.url, trust_env=False) as http:
        openai_answer = await http.post(
            "/v1/chat/completions", json={"model": "m", "messages": "not a list"}
        )
        anthropic_answer = await http.post(
            "/v1/messages", content=b"{not json", headers={"content-type": "application/json"}
        )

    assert openai_answer.status_code == 400
    assert openai_answer.json()["error"]["type"] == "invalid_request_error"
    assert "messages" in openai_answer.json()["error"]["message"]
    assert anthropic_answer.status_code == 400
    assert anthropic_answer.json()["type"] == "error"
    assert [r["answer"] for r in llm.requests()] == ["rejected", "rejected"]


async def test_misspelt_turn_fields_are_refused_by_the_control_api(llm: ScriptedLlm) -> None:
    async with httpx2.AsyncClient(base_url=llm.url, trust_env=False) as http:
        answer = await http.post(
            "/_scripted/scenarios", json={"name": "typo", "turns": [{"txt": "hello"}]}
        )

    assert answer.status_code == 422
    assert "txt" in answer.json()["error"]


# --- scenario selection and queues -------------------------------------------------------


async def test_scenario_is_chosen_by_marker_then_model_name_then_default(
    llm: ScriptedLlm,
    openai_client: openai.AsyncOpenAI,
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    llm.set_scenario("by-marker", [{"text": "marker in system"}, {"text": "marker in message"}])
    llm.set_scenario("by-model", [{"text": "model name"}])
    llm.set_scenario("default", [{"text": "default queue"}])

    in_system = await openai_client.chat.completions.create(
        model="by-model",
        messages=[
            {"role": "system", "content": "You are terse. [[scenario:by-marker]]"},
            {"role": "user", "content": "hi [[scenario:ignored-later-marker]]"},
        ],
    )
    in_message = await anthropic_client.messages.create(
        model="by-model",
        max_tokens=10,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "[[scenario:by-marker]]"}]}
        ],
    )
    by_model = await openai_client.chat.completions.create(model="by-model", messages=USER_HI)
    unknown_model = await openai_client.chat.completions.create(model="gpt-x", messages=USER_HI)
    # Out of turns: an error the SDK raises, never a text that would be posted as a reply.
    with pytest.raises(openai.BadRequestError) as exhausted:
        await openai_client.chat.completions.create(model="by-model", messages=USER_HI)

    assert in_system.choices[0].message.content == "marker in system"
    assert [b.text for b in in_message.content if b.type == "text"] == ["marker in message"]
    assert by_model.choices[0].message.content == "model name"
    assert unknown_model.choices[0].message.content == "default queue"
    assert exhausted.value.status_code == 400
    assert "scenario 'by-model' has no turn left" in exhausted.value.message
    assert [r["scenario"] for r in llm.requests()] == [
        "by-marker",
        "by-marker",
        "by-model",
        "default",
        "by-model",
    ]
    assert [r["answer"] for r in llm.requests()][-1] == "default"


async def test_default_turn_is_configurable(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.configure(default_turn={"text": "nothing scripted here"})

    completion = await openai_client.chat.completions.create(model="gpt-x", messages=USER_HI)

    assert completion.choices[0].message.content == "nothing scripted here"


async def test_two_scenarios_interleave_and_overlap_without_mixing_turns(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.set_scenario("task-a", [{"text": "a1", "delay_s": 1.5}, {"text": "a2"}])
    llm.set_scenario("task-b", [{"text": "b1"}, {"text": "b2"}])
    answers: dict[str, list[str]] = {"task-a": [], "task-b": []}

    async def ask(scenario: str) -> None:
        completion = await openai_client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": f"[[scenario:{scenario}]] go"}],
        )
        answers[scenario].append(completion.choices[0].message.content or "")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(ask, "task-a")
        await _until_in_flight(llm, 1)
        # task-a's first answer is still on its way while task-b runs both of its turns.
        await ask("task-b")
        await ask("task-b")
    await ask("task-a")

    assert answers == {"task-a": ["a1", "a2"], "task-b": ["b1", "b2"]}
    assert llm.stats()["max_concurrent"] == 2
    assert [r["scenario"] for r in llm.requests("task-b")] == ["task-b", "task-b"]


async def _until_in_flight(llm: ScriptedLlm, count: int) -> None:
    for _ in range(2_000):
        if llm.stats()["in_flight"] >= count:
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"never {count} model requests in flight: {llm.stats()}")


# --- storm and latency -------------------------------------------------------------------


async def test_storm_answers_every_request_until_calmed_and_keeps_the_turns(
    llm: ScriptedLlm,
    openai_client: openai.AsyncOpenAI,
    anthropic_client: anthropic.AsyncAnthropic,
) -> None:
    llm.set_scenario("default", [{"text": "after the storm"}])
    llm.storm(status=429, seconds=60, retry_after_s=2)

    for _ in range(3):
        with pytest.raises(openai.RateLimitError) as storm_error:
            await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
        assert storm_error.value.response.headers["retry-after"] == "2"
    with pytest.raises(anthropic.RateLimitError):
        await anthropic_client.messages.create(model="c", max_tokens=10, messages=USER_HI)
    during = llm.stats()
    llm.calm()
    after = await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)

    assert (during["requests"], during["storm_answers"]) == (4, 4)
    assert after.choices[0].message.content == "after the storm"
    assert llm.stats()["storm_answers"] == 4
    assert [r["answer"] for r in llm.requests()] == ["storm"] * 4 + ["turn"]


async def test_storm_of_another_status_and_storm_already_over(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.storm(status=503, seconds=60, retry_after_s=None)
    with pytest.raises(openai.InternalServerError) as overloaded:
        await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
    assert overloaded.value.status_code == 503
    assert "retry-after" not in overloaded.value.response.headers

    llm.storm(status=429, seconds=-1)
    with pytest.raises(openai.BadRequestError, match="'default' has no turn left"):
        await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)


async def test_latency_delays_every_answer_and_calls_overlap(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.configure(latency_s=0.5)
    llm.set_scenario("default", [{"text": "first"}, {"text": "second"}])
    started = anyio.current_time()

    async with anyio.create_task_group() as tasks:
        for _ in range(2):
            tasks.start_soon(
                lambda: openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
            )

    # A lower bound only: the pause is a sleep that never ends early.
    assert anyio.current_time() - started >= 0.45
    assert llm.stats()["latency_s"] == 0.5
    assert llm.stats()["max_concurrent"] == 2


# --- recording ---------------------------------------------------------------------------


async def test_requests_are_recorded_without_auth_values(llm: ScriptedLlm) -> None:
    secret = "sk-live-" + "Zq7" * 12
    llm.set_scenario("default", [{"text": "one"}, {"text": "two"}])
    async with (
        openai.AsyncOpenAI(base_url=llm.openai_base_url, api_key=secret, max_retries=0) as oai,
        anthropic.AsyncAnthropic(
            base_url=llm.anthropic_base_url, api_key=secret, max_retries=0
        ) as claude,
    ):
        await oai.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "system", "content": "be kind"}, *USER_HI],
            tools=[WEATHER_TOOL],
        )
        await claude.messages.create(model="claude-test", max_tokens=10, messages=USER_HI)

    recorded = llm.requests()
    assert secret not in json.dumps(recorded)
    openai_record, anthropic_record = recorded
    assert (openai_record["path"], openai_record["api"]) == ("/v1/chat/completions", "openai")
    assert openai_record["auth_present"] is True
    assert openai_record["auth_length"] == len(f"Bearer {secret}")
    assert "authorization" not in openai_record["headers"]
    assert openai_record["headers"]["content-type"] == "application/json"
    assert openai_record["body"]["messages"][0] == {"role": "system", "content": "be kind"}
    assert openai_record["body"]["tools"][0]["function"]["name"] == "get_weather"
    # anthropic 2.x sends the key as a bearer token; Claude Code sends x-api-key.
    assert set(anthropic_record["auth_headers"].values()) <= {len(secret), len(f"Bearer {secret}")}
    assert not {"x-api-key", "authorization"} & set(anthropic_record["headers"])
    assert "anthropic-version" in anthropic_record["headers"]
    assert anthropic_record["body"]["max_tokens"] == 10
    assert [r["seq"] for r in recorded] == [1, 2]


async def test_reset_forgets_scenarios_requests_and_settings(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    llm.set_scenario("default", [{"text": "scripted"}])
    llm.configure(latency_s=0.2)
    await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)
    llm.set_scenario("default", [{"text": "never answered"}])

    llm.reset()
    with pytest.raises(openai.BadRequestError, match="has no turn left"):
        await openai_client.chat.completions.create(model="gpt-test", messages=USER_HI)

    assert len(llm.requests()) == 1
    assert llm.stats()["requests"] == 1
    assert llm.stats()["latency_s"] == 0.0


async def test_every_kind_of_auth_header_is_kept_out_of_the_record(llm: ScriptedLlm) -> None:
    secret = "sk-ant-" + "k3y" * 10
    async with httpx2.AsyncClient(base_url=llm.url, trust_env=False) as http:
        await http.post(
            "/v1/messages?beta=true",
            json={"model": "m", "max_tokens": 5, "messages": USER_HI},
            headers={"x-api-key": secret, "api-key": secret, "cookie": f"session={secret}"},
        )

    (record,) = llm.requests()
    assert secret not in json.dumps(record)
    assert record["auth_headers"] == {
        "x-api-key": len(secret),
        "api-key": len(secret),
        "cookie": len(f"session={secret}"),
    }
    assert record["query"] == "beta=true"


# --- the built-in demo agent -------------------------------------------------------------


def _openai_hub_tools() -> list[Any]:
    return [
        {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}
        for name, schema in HUB_TOOL_SCHEMAS.items()
    ]


def _anthropic_hub_tools() -> list[Any]:
    return [
        {"name": name, "description": name, "input_schema": schema}
        for name, schema in HUB_TOOL_SCHEMAS.items()
    ]


THREAD_RESULT = (
    "[p-1] m/general · by alice (Alice) at 2026-11-20 10:00 UTC\n"
    "Title: Retrying rq jobs\n"
    "How do I retry failed rq jobs without losing their arguments?\n"
    "\n"
    "No comments yet."
)


async def test_demo_agent_reads_the_thread_then_answers_quoting_it(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are demo-agent, a helpful member of the Hub."},
        {
            "role": "user",
            "content": "You were mentioned or replied to on the Hub, in the thread of post p-1.\n"
            "Read the thread and write your reply to it.\n"
            '<untrusted-content kind="thread">\n[post p-1] in m/general by Alice (@alice)\n'
            "How do I retry failed rq jobs? I want to explore the options.\n</untrusted-content>",
        },
    ]

    first = await openai_client.chat.completions.create(
        model="demo", messages=messages, tools=_openai_hub_tools()
    )
    calls = [c for c in first.choices[0].message.tool_calls or () if c.type == "function"]
    assert first.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("hub__get_thread", {"post_id": "p-1"})
    ]

    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": THREAD_RESULT},
    ]
    second = await openai_client.chat.completions.create(
        model="demo", messages=messages, tools=_openai_hub_tools()
    )

    final = second.choices[0]
    assert final.finish_reason == "stop"
    assert final.message.tool_calls is None
    assert final.message.content is not None
    assert "Alice" in final.message.content
    assert "How do I retry failed rq jobs without losing their arguments?" in final.message.content
    assert first.usage is not None and second.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens, "estimated from request size"
    assert [r["answer"] for r in llm.requests()] == ["demo", "demo"]


async def test_demo_agent_explores_searches_posts_a_round_up_and_reports(
    llm: ScriptedLlm, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    tools: Any = [
        {"name": name, "description": name, "input_schema": schema}
        for name, schema in HUB_TOOL_SCHEMAS.items()
    ]
    prompt = (
        "[[scenario:demo]] You are exploring the Hub on your own. Look at the discovery feed.\n"
        "Your interests: agents, python, redis.\n"
        "Your communities: m/general.\n\n"
        '<untrusted-content kind="discovery-feed">\n[post p-3] in m/general by Bob (@bob)'
        " — Redis queues\nHow big should redis be for rq?\n</untrusted-content>"
    )
    messages: list[Any] = [{"role": "user", "content": prompt}]
    search_result = (
        "2 posts:\n\n[p-3] m/general · by bob (Bob)\nTitle: Redis queues\nHow big should it be?"
        "\n\n[p-5] m/general · by carol\nTitle: Redis persistence\nAOF or RDB?"
    )

    async def step(result_text: str | None) -> anthropic.types.Message:
        if result_text is not None:
            call = next(b for b in messages[-1]["content"] if b["type"] == "tool_use")
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call["id"], "content": result_text}
                    ],
                }
            )
        answer = await anthropic_client.messages.create(
            model="claude-test", max_tokens=500, messages=messages, tools=tools
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in answer.content]})
        return answer

    search = await step(None)
    post = await step(search_result)
    final = await step("Created post p-9 in m/general.")

    search_calls = [(b.name, b.input) for b in search.content if b.type == "tool_use"]
    assert search_calls == [("hub__search_posts", {"query": "redis"})]
    post_calls = [(b.name, b.input) for b in post.content if b.type == "tool_use"]
    assert [name for name, _ in post_calls] == ["hub__create_post"]
    new_post: dict[str, Any] = dict(post_calls[0][1])
    assert new_post["community"] == "m/general"
    assert "Redis queues" in str(new_post["content"])
    assert final.stop_reason == "end_turn"
    final_text = "".join(b.text for b in final.content if b.type == "text")
    assert '"Redis queues"' in final_text
    assert "Created post p-9" in final_text


async def test_demo_agent_streams_to_claude_code_style_tool_names(
    llm: ScriptedLlm, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    tools: Any = [
        {"name": f"mcp__{name}", "description": name, "input_schema": schema}
        for name, schema in HUB_TOOL_SCHEMAS.items()
    ]
    messages: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Please answer [post p-42]."}]}
    ]

    async with anthropic_client.messages.stream(
        model="demo", max_tokens=500, messages=messages, tools=tools
    ) as stream:
        first = await stream.get_final_message()
    (call,) = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": THREAD_RESULT.replace("p-1", "p-42")}],
                }
            ],
        },
    ]
    async with anthropic_client.messages.stream(
        model="demo", max_tokens=500, messages=messages, tools=tools
    ) as stream:
        second = await stream.get_final_message()

    assert (call.name, call.input) == ("mcp__hub__get_thread", {"post_id": "p-42"})
    assert second.stop_reason == "end_turn"
    assert '"Retrying rq jobs"' in "".join(b.text for b in second.content if b.type == "text")


async def test_demo_agent_without_tools_answers_in_text(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI
) -> None:
    completion = await openai_client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "What is the Hub?"}]
    )

    assert completion.choices[0].finish_reason == "stop"
    assert "What is the Hub?" in (completion.choices[0].message.content or "")


async def test_tools_listed_with_a_tool_choice_of_none_get_a_text_answer_in_both_sdks(
    llm: ScriptedLlm, openai_client: openai.AsyncOpenAI, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    # A closing call lists the tools (its prefix stays cached) and lets the model call none:
    # the demo agent, which would read the thread with them, answers in text instead.
    question = "You were mentioned in the thread of post p-1. What is the Hub?"
    completion = await openai_client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": question}],
        tools=_openai_hub_tools(),
        tool_choice="none",
    )
    assert completion.choices[0].finish_reason == "stop"
    assert not completion.choices[0].message.tool_calls
    message = await anthropic_client.messages.create(
        model="demo",
        max_tokens=256,
        messages=[{"role": "user", "content": question}],
        tools=_anthropic_hub_tools(),
        tool_choice={"type": "none"},
    )
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["text"]


# --- as its own process ------------------------------------------------------------------


async def test_subprocess_endpoint_with_scenario_file_serves_and_exits_cleanly(
    tmp_path: Path,
) -> None:
    scenario_file = tmp_path / "scenarios.json"
    scenario_file.write_text(
        json.dumps(
            {
                "scenarios": {"from-file": [{"text": "from the file"}]},
                "default_turn": {"text": "file default"},
            }
        )
    )

    with running_scripted_llm(subprocess=True, scenario_file=scenario_file) as llm:
        async with anthropic.AsyncAnthropic(
            base_url=llm.anthropic_base_url, api_key="k", max_retries=0
        ) as claude:
            from_file = await claude.messages.create(
                model="from-file", max_tokens=10, messages=USER_HI, stream=False
            )
            fallback = await claude.messages.create(model="x", max_tokens=10, messages=USER_HI)
            llm.set_scenario("later", [{"text": "set over HTTP"}])
            later = await claude.messages.create(model="later", max_tokens=10, messages=USER_HI)
            llm.reset()
            again = await claude.messages.create(model="from-file", max_tokens=10, messages=USER_HI)
        process = llm.process

    def text(message: anthropic.types.Message) -> str:
        return "".join(b.text for b in message.content if b.type == "text")

    assert [text(m) for m in (from_file, fallback, later, again)] == [
        "from the file",
        "file default",
        "set over HTTP",
        "from the file",
    ]
    assert process is not None and process.returncode == 0
