"""Structured output: ask any Model for an answer shaped like a pydantic model.

``generate(model, request, Verdict)`` sends Verdict's JSON schema in the strict
form both providers accept (every property required, no extra properties,
constraints moved into descriptions, validated here instead), then reads the
answer tolerantly: code fences, prose around the JSON and trailing text are fine.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, TypeVar

import pydantic

from worker import logs
from worker.exceptions import StructuredOutputError
from worker.models._types import Model, ModelRequest, ModelResponse, StopReason

T = TypeVar("T", bound=pydantic.BaseModel)

# Providers reject or ignore these in strict mode; pydantic still checks them on the answer.
_HINT_KEYWORDS = (
    "format",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
)
_KEPT_KEYWORDS = ("type", "enum", "const", "description")
_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_RAW_ANSWER_MAX_CHARS = 2_000
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")


async def generate(model: Model, request: ModelRequest, output_type: type[T]) -> T:
    """Ask ``model`` for one ``output_type``; raise StructuredOutputError when it gives none."""
    structured_request = dataclasses.replace(
        request,
        response_schema=strict_json_schema(output_type),
        response_schema_name=_SCHEMA_NAME.sub("_", output_type.__name__)[:64] or "answer",
    )
    response = await model.complete(structured_request)
    return parse_structured(response, output_type)


def parse_structured(response: ModelResponse, output_type: type[T]) -> T:
    """Read ``output_type`` out of an answer's text, however it was wrapped."""
    try:
        return output_type.model_validate(_first_json_object(response.text))
    except (ValueError, pydantic.ValidationError) as exc:
        raise StructuredOutputError(
            f"{response.provider} model {response.model!r} did not answer with a valid "
            f"{output_type.__name__}: {_problem(exc)}{_stop_hint(response)}",
            model=response.model,
            raw=logs.redact(response.text)[:_RAW_ANSWER_MAX_CHARS],
        ) from exc


def parse_structured_text(text: str, output_type: type[T]) -> T:
    """``parse_structured`` for a final text (a run's output, a CLI's answer), when the
    response it came from is not at hand."""
    try:
        return output_type.model_validate(_first_json_object(text))
    except (ValueError, pydantic.ValidationError) as exc:
        raise StructuredOutputError(
            f"the answer is not a valid {output_type.__name__}: {_problem(exc)}",
            model="",
            raw=logs.redact(text)[:_RAW_ANSWER_MAX_CHARS],
        ) from exc


def _problem(exc: ValueError | pydantic.ValidationError) -> str:
    return _validation_summary(exc) if isinstance(exc, pydantic.ValidationError) else str(exc)


def strict_json_schema(output_type: type[pydantic.BaseModel]) -> dict[str, Any]:
    """``output_type``'s JSON schema in the strict form the providers accept."""
    schema = output_type.model_json_schema()
    definitions = schema.pop("$defs", {})
    converter = _StrictSchema(definitions, root_name=output_type.__name__)
    strict = converter.convert(schema, path="$", expanding=frozenset())
    if converter.recursive:
        strict["$defs"] = converter.recursive_definitions()
    return strict


class _StrictSchema:
    """Inlines ``$ref``s (keeping ``$defs`` only for recursive types) and tightens every object."""

    def __init__(self, definitions: dict[str, Any], *, root_name: str) -> None:
        self._definitions = definitions
        self._root_name = root_name
        self.recursive: set[str] = set()

    def convert(
        self, node: dict[str, Any], *, path: str, expanding: frozenset[str]
    ) -> dict[str, Any]:
        if "$ref" in node:
            return self._resolve(node, path=path, expanding=expanding)
        if "allOf" in node and len(node["allOf"]) == 1:
            merged = {key: value for key, value in node.items() if key != "allOf"}
            return self.convert({**node["allOf"][0], **merged}, path=path, expanding=expanding)
        strict: dict[str, Any] = {key: node[key] for key in _KEPT_KEYWORDS if key in node}
        hints = [f"{key}: {node[key]}" for key in _HINT_KEYWORDS if key in node]
        if hints:
            described = strict.get("description", "")
            strict["description"] = f"{described} ({'; '.join(hints)})".strip()
        variants = node.get("anyOf") or node.get("oneOf")
        if variants:
            strict["anyOf"] = [
                self.convert(variant, path=f"{path}|{index}", expanding=expanding)
                for index, variant in enumerate(variants)
            ]
        if node.get("type") == "object" or "properties" in node:
            strict.update(self._object(node, path=path, expanding=expanding))
        if "items" in node:
            strict["items"] = self.convert(node["items"], path=f"{path}[]", expanding=expanding)
        if "prefixItems" in node:
            strict["prefixItems"] = [
                self.convert(item, path=f"{path}[{index}]", expanding=expanding)
                for index, item in enumerate(node["prefixItems"])
            ]
        return strict

    def _object(
        self, node: dict[str, Any], *, path: str, expanding: frozenset[str]
    ) -> dict[str, Any]:
        properties: dict[str, Any] = node.get("properties", {})
        extra = node.get("additionalProperties")
        if not properties and isinstance(extra, dict | bool) and extra not in (False, {}):
            raise TypeError(
                f"{self._root_name}: {path} is a free-form mapping; strict structured output "
                "needs named fields (use a nested model)"
            )
        return {
            "type": "object",
            "properties": {
                name: self.convert(schema, path=f"{path}.{name}", expanding=expanding)
                for name, schema in properties.items()
            },
            "required": list(properties),
            "additionalProperties": False,
        }

    def _resolve(
        self, node: dict[str, Any], *, path: str, expanding: frozenset[str]
    ) -> dict[str, Any]:
        name = str(node["$ref"]).rsplit("/", 1)[-1]
        if name in expanding:
            self.recursive.add(name)
            return {"$ref": f"#/$defs/{name}"}
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        resolved = self.convert(
            {**self._definitions[name], **siblings}, path=path, expanding=expanding | {name}
        )
        return resolved

    def recursive_definitions(self) -> dict[str, Any]:
        definitions: dict[str, Any] = {}
        pending = sorted(self.recursive)
        while pending:
            name = pending.pop()
            if name in definitions:
                continue
            definitions[name] = self.convert(
                self._definitions[name], path=f"$defs.{name}", expanding=frozenset({name})
            )
            pending.extend(sorted(self.recursive - definitions.keys()))
        return definitions


def _first_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``: the whole answer, a code fence, or amid prose."""
    stripped = text.strip()
    if not stripped:
        raise ValueError("the answer was empty")
    for candidate in (stripped, *(block.strip() for block in _FENCE.findall(stripped))):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for opening_brace in re.finditer(r"\{", stripped):
        try:
            value, _ = decoder.raw_decode(stripped, opening_brace.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError("no JSON object found in the answer")


def _validation_summary(error: pydantic.ValidationError, *, limit: int = 3) -> str:
    problems = [
        f"{'.'.join(str(part) for part in detail['loc']) or '<root>'}: {detail['msg']}"
        for detail in error.errors(include_url=False, include_input=False)
    ]
    shown = "; ".join(problems[:limit])
    more = len(problems) - limit
    return f"{shown} (and {more} more)" if more > 0 else shown


def _stop_hint(response: ModelResponse) -> str:
    if response.stop_reason is StopReason.MAX_TOKENS:
        return " (the answer was cut off at the output token limit)"
    if response.stop_reason is StopReason.REFUSAL:
        return " (the model refused)"
    if not response.text.strip() and response.tool_calls:
        return " (it called a tool instead)"
    return ""
