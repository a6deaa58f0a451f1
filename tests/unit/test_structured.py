"""generate(): strict schemas out, tolerant decoding in."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from tests.support.provider_wire import FakeProvider, completion
from worker.exceptions import StructuredOutputError
from worker.models._openai import OpenAIModel
from worker.models._scripted import ScriptedModel, Turn
from worker.models._structured import generate, strict_json_schema
from worker.models._types import Message, ModelRequest, StopReason


class Tag(BaseModel):
    name: str = Field(max_length=20, description="A short label.")


class Verdict(BaseModel):
    """Whether the post breaks the rules."""

    title: str = "untitled"
    flagged: bool
    confidence: float = Field(ge=0, le=1)
    tags: list[Tag]
    severity: Literal["low", "high"] | None = None


class Thread(BaseModel):
    text: str
    replies: list[Thread] = []


def ask() -> ModelRequest:
    return ModelRequest(system="Judge.", messages=[Message(role="user", content="post p-1")])


VALID = {
    "title": "spam",
    "flagged": True,
    "confidence": 0.9,
    "tags": [{"name": "ads"}],
    "severity": "high",
}


def schema_nodes(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A schema and every schema nested in it (property names are not schemas)."""
    nested: list[dict[str, Any]] = [
        *schema.get("properties", {}).values(),
        *schema.get("anyOf", []),
        *schema.get("$defs", {}).values(),
    ]
    if "items" in schema:
        nested.append(schema["items"])
    return [schema, *(node for child in nested for node in schema_nodes(child))]


def test_strict_schema_requires_everything_and_allows_nothing_extra() -> None:
    schema = strict_json_schema(Verdict)
    assert schema["type"] == "object"
    assert schema["required"] == ["title", "flagged", "confidence", "tags", "severity"]
    assert schema["additionalProperties"] is False
    tag_schema = schema["properties"]["tags"]["items"]  # the $ref is inlined
    assert tag_schema["additionalProperties"] is False
    assert tag_schema["required"] == ["name"]
    assert "A short label." in tag_schema["properties"]["name"]["description"]
    assert "maxLength: 20" in tag_schema["properties"]["name"]["description"]
    for node in schema_nodes(schema):
        for banned in ("title", "default", "$ref", "maxLength", "minimum", "maximum", "$defs"):
            assert banned not in node, (banned, node)
    assert {"enum": ["low", "high"], "type": "string"} in schema["properties"]["severity"]["anyOf"]


def test_recursive_models_keep_their_definition() -> None:
    schema = strict_json_schema(Thread)
    assert schema["properties"]["replies"]["items"] == {"$ref": "#/$defs/Thread"}
    assert schema["$defs"]["Thread"]["required"] == ["text", "replies"]
    assert schema["$defs"]["Thread"]["additionalProperties"] is False


def test_free_form_mappings_are_refused() -> None:
    class Loose(BaseModel):
        extra: dict[str, int]

    with pytest.raises(TypeError, match=r"Loose: \$\.extra is a free-form mapping"):
        strict_json_schema(Loose)


@pytest.mark.anyio
async def test_generate_sends_the_schema_and_validates_the_answer() -> None:
    model = ScriptedModel([Turn(text=json.dumps(VALID))], name="judge")
    verdict = await generate(model, ask(), Verdict)
    assert verdict == Verdict.model_validate(VALID)
    sent = model.requests[0]
    assert sent.response_schema == strict_json_schema(Verdict)
    assert sent.response_schema_name == "Verdict"
    assert sent.messages[0].content == "post p-1"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer",
    [
        f"```json\n{json.dumps(VALID, indent=2)}\n```",
        f"Here is my verdict:\n```\n{json.dumps(VALID)}\n```\nLet me know!",
        f"Sure. {json.dumps(VALID)} I hope this helps {{not json}}",
        f"I think {{maybe}} then {json.dumps(VALID)}",
    ],
)
async def test_tolerant_decoding(answer: str) -> None:
    model = ScriptedModel([Turn(text=answer)])
    assert (await generate(model, ask(), Verdict)).flagged is True


@pytest.mark.anyio
async def test_invalid_answer_names_the_model_and_the_problem() -> None:
    wrong = {**VALID, "confidence": 3, "tags": "ads"}
    model = ScriptedModel([Turn(text=json.dumps(wrong))], name="judge-7", provider="openai")
    with pytest.raises(StructuredOutputError) as caught:
        await generate(model, ask(), Verdict)
    assert caught.value.model == "judge-7"
    assert "openai model 'judge-7'" in caught.value.message
    assert "valid Verdict" in caught.value.message
    assert "confidence" in caught.value.message
    assert "tags" in caught.value.message
    assert caught.value.raw == json.dumps(wrong)


@pytest.mark.anyio
async def test_no_json_at_all_and_truncation_are_explained() -> None:
    prose = ScriptedModel([Turn(text="I would rather not say.")], name="shy")
    with pytest.raises(StructuredOutputError, match="no JSON object found"):
        await generate(prose, ask(), Verdict)

    cut = ScriptedModel([Turn(text='{"flagged": true, "conf', stop_reason=StopReason.MAX_TOKENS)])
    with pytest.raises(StructuredOutputError, match="cut off at the output token limit"):
        await generate(cut, ask(), Verdict)


@pytest.mark.anyio
async def test_generate_through_openai_uses_strict_response_format() -> None:
    fake = FakeProvider(completion(json.dumps(VALID), model="gpt-4o-mini"))
    model = OpenAIModel("gpt-4o-mini", api_key="sk-test", http_client=fake.client())
    verdict = await generate(model, ask(), Verdict)
    assert verdict.tags == [Tag(name="ads")]
    assert fake.body(0)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Verdict", "schema": strict_json_schema(Verdict), "strict": True},
    }
