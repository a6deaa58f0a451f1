"""FallbackModel, and create_model wiring providers, keys and fallbacks together."""

from __future__ import annotations

import json

import fakeredis
import httpx2
import pytest

from tests.support.provider_wire import FakeProvider, answering_every_request, completion
from worker.exceptions import (
    AgentConfigError,
    ConfigurationError,
    ModelAuthError,
    ModelRequestError,
    ModelUnavailable,
)
from worker.models import FleetLimiter, RateLimits
from worker.models._anthropic import AnthropicModel
from worker.models._factory import aclose_shared_http_clients, create_model, shared_http_client
from worker.models._fallback import FallbackModel
from worker.models._openai import OpenAIModel
from worker.models._prices import PriceTable
from worker.models._retry import RetryPolicy
from worker.models._scripted import ScriptedModel, Turn
from worker.models._types import Message, ModelRequest
from worker.settings import Settings


def ask(timeout_s: float | None = None) -> ModelRequest:
    return ModelRequest(
        system="", messages=[Message(role="user", content="hi")], timeout_s=timeout_s
    )


def down(retry_after_s: float | None = None) -> Turn:
    return Turn(
        error=ModelUnavailable("primary down", provider="p", model="m", retry_after_s=retry_after_s)
    )


@pytest.mark.anyio
async def test_moves_to_the_next_model_when_one_is_unavailable() -> None:
    primary = ScriptedModel([down()], name="big", provider="anthropic")
    backup = ScriptedModel([Turn(text="from backup")], name="small", provider="openai")
    model = FallbackModel([primary, backup])
    assert (model.provider, model.name) == ("anthropic", "big")

    response = await model.complete(ask())

    assert response.text == "from backup"
    assert (model.provider, model.name) == ("openai", "small")
    assert len(primary.requests) == len(backup.requests) == 1


@pytest.mark.anyio
async def test_auth_error_on_one_provider_tries_the_next() -> None:
    primary = ScriptedModel([Turn(error=ModelAuthError("bad key"))], name="a")
    backup = ScriptedModel([Turn(text="ok")], name="b")
    assert (await FallbackModel([primary, backup]).complete(ask())).text == "ok"


@pytest.mark.anyio
async def test_request_error_is_raised_without_trying_others() -> None:
    primary = ScriptedModel([Turn(error=ModelRequestError("too long"))], name="a")
    backup = ScriptedModel([Turn(text="ok")], name="b")
    with pytest.raises(ModelRequestError, match="too long"):
        await FallbackModel([primary, backup]).complete(ask())
    assert backup.requests == []


@pytest.mark.anyio
async def test_all_unavailable_raises_model_unavailable_naming_each() -> None:
    first = ScriptedModel([down(retry_after_s=5.0)], name="a")
    second = ScriptedModel(
        [Turn(error=ModelUnavailable("b is down", provider="openai", model="b", retry_after_s=9))],
        name="b",
    )
    third = ScriptedModel([Turn(error=ModelAuthError("c has a bad key"))], name="c")
    with pytest.raises(ModelUnavailable) as caught:
        await FallbackModel([first, second, third]).complete(ask())
    assert caught.value.retry_after_s == 9
    assert (caught.value.provider, caught.value.model) == ("openai", "b")
    for part in ("primary down", "b is down", "c has a bad key"):
        assert part in caught.value.message


@pytest.mark.anyio
async def test_each_model_gets_what_is_left_of_the_budget() -> None:
    now = [0.0]

    def slow_failure(request: ModelRequest) -> Turn:
        now[0] += 7.0
        return down()

    primary = ScriptedModel([slow_failure], name="a")
    backup = ScriptedModel([Turn(text="ok")], name="b")
    await FallbackModel([primary, backup], clock=lambda: now[0]).complete(ask(timeout_s=10.0))
    assert primary.requests[0].timeout_s == 10.0
    assert backup.requests[0].timeout_s == pytest.approx(3.0)


@pytest.mark.anyio
async def test_real_providers_fall_back_from_anthropic_to_openai() -> None:
    overloaded = {"type": "error", "error": {"message": "overloaded"}}
    anthropic = FakeProvider(*(httpx2.Response(529, json=overloaded) for _ in range(2)))
    openai = FakeProvider(
        completion(
            "backup answer",
            model="gpt-4o-mini",
            usage={"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        )
    )

    async def no_wait(seconds: float) -> None:
        return None

    retry = RetryPolicy(max_retries=1, sleep=no_wait)
    primary = AnthropicModel(
        "claude-sonnet-4-5", api_key="sk-ant-test", retry=retry, http_client=anthropic.client()
    )
    backup = OpenAIModel("gpt-4o-mini", api_key="sk-test", retry=retry, http_client=openai.client())
    model = FallbackModel([primary, backup])

    response = await model.complete(ask())

    assert len(anthropic.requests) == 2
    assert (response.text, response.provider, response.model) == (
        "backup answer",
        "openai",
        "gpt-4o-mini",
    )
    assert (model.provider, model.name) == ("openai", "gpt-4o-mini")


def settings(**values: object) -> Settings:
    defaults: dict[str, object] = {
        "anthropic_api_key": None,
        "anthropic_base_url": None,
        "openai_api_key": None,
        "openai_base_url": None,
        "llm_max_retries": 2,
        "llm_timeout_s": 45.0,
    }
    # Explicit values win over the environment, so a developer's real keys never leak in.
    return Settings.model_validate({**defaults, **values})


def test_create_model_picks_the_provider_and_reads_keys_from_settings() -> None:
    model = create_model(
        "anthropic",
        "claude-haiku-4-5",
        settings=settings(anthropic_api_key="sk-ant-from-env"),
        prices=PriceTable.builtin(),
    )
    assert isinstance(model, AnthropicModel)
    assert (model.provider, model.name) == ("anthropic", "claude-haiku-4-5")


def test_create_model_wraps_fallbacks() -> None:
    model = create_model(
        "anthropic",
        "claude-sonnet-4-5",
        api_key="sk-ant-explicit",
        fallbacks=[("anthropic", "claude-haiku-4-5"), ("openai", "gpt-4o-mini")],
        settings=settings(openai_api_key="sk-openai-env"),
        prices=PriceTable.builtin(),
    )
    assert isinstance(model, FallbackModel)
    assert [(m.provider, m.name) for m in model.models] == [
        ("anthropic", "claude-sonnet-4-5"),
        ("anthropic", "claude-haiku-4-5"),
        ("openai", "gpt-4o-mini"),
    ]


@pytest.mark.parametrize(
    ("provider", "variable"), [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")]
)
def test_missing_key_names_the_environment_variable(provider: str, variable: str) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        create_model(provider, "some-model", settings=settings(), prices=PriceTable.builtin())


def test_missing_key_of_a_fallback_is_reported_too() -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        create_model(
            "anthropic",
            "claude-haiku-4-5",
            fallbacks=[("openai", "gpt-4o")],
            settings=settings(anthropic_api_key="sk-ant-x"),
            prices=PriceTable.builtin(),
        )


def test_unknown_provider_is_an_agent_config_error() -> None:
    with pytest.raises(AgentConfigError, match="'gemini'"):
        create_model(
            "gemini", "gemini-pro", api_key="k", settings=settings(), prices=PriceTable.builtin()
        )


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[httpx2.Request]:
    """Every request the factory's models send; each is answered 500."""
    return answering_every_request(monkeypatch, 500, "boom")


@pytest.mark.anyio
async def test_created_model_uses_settings_base_url_timeout_and_retries(
    sent: list[httpx2.Request],
) -> None:
    model = create_model(
        "openai",
        "llama3.1",
        settings=settings(
            openai_api_key="sk-local",
            openai_base_url="http://vllm.test/v1",
            llm_max_retries=1,
            llm_timeout_s=45.0,
        ),
        prices=PriceTable.builtin(),
    )
    with pytest.raises(ModelUnavailable, match="2 attempts"):
        await model.complete(ask())
    assert len(sent) == 2
    assert str(sent[0].url) == "http://vllm.test/v1/chat/completions"
    assert sent[0].extensions["timeout"]["read"] == 45.0
    assert json.loads(sent[0].content)["model"] == "llama3.1"
    assert sent[0].headers["authorization"] == "Bearer sk-local"


@pytest.mark.anyio
async def test_models_in_one_event_loop_share_a_connection_pool() -> None:
    config = settings(anthropic_api_key="sk-ant-x", openai_api_key="sk-x")
    first = create_model(
        "anthropic", "claude-haiku-4-5", settings=config, prices=PriceTable.builtin()
    )
    second = create_model(
        "anthropic", "claude-opus-4-5", settings=config, prices=PriceTable.builtin()
    )
    other = create_model("openai", "gpt-4o", settings=config, prices=PriceTable.builtin())
    assert isinstance(first, AnthropicModel) and isinstance(second, AnthropicModel)
    assert isinstance(other, OpenAIModel)
    pool = shared_http_client("anthropic", None)
    assert first._client._client is pool
    assert second._client._client is pool
    assert other._client._client is not pool
    await aclose_shared_http_clients()
    assert pool is not None and pool.is_closed


def test_no_shared_pool_outside_an_event_loop() -> None:
    assert shared_http_client("anthropic", None) is None


@pytest.mark.anyio
async def test_a_rate_limiter_gates_every_attempt_of_every_model_in_the_chain(
    sent: list[httpx2.Request],
    redis: fakeredis.FakeRedis,
) -> None:
    model = create_model(
        "openai",
        "primary",
        fallbacks=[("openai", "backup")],
        settings=settings(openai_api_key="sk-local", llm_max_retries=1),
        prices=PriceTable.builtin(),
        rate_limiter=FleetLimiter(redis, "openai", "primary", RateLimits(requests_per_minute=1)),
    )

    with pytest.raises(ModelUnavailable):
        await model.complete(ask(timeout_s=1.0))

    # One request per model's bucket: each retry found its bucket empty before the deadline.
    assert [json.loads(request.content)["model"] for request in sent] == ["primary", "backup"]
    assert redis.exists("agent-worker:limiter:openai:backup:requests")
