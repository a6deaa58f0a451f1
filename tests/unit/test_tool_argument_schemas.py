"""Tool arguments checked against the tool's input schema: prepared once per process, a
compiled accept path where it means what jsonschema means, jsonschema's verdict and words
everywhere else."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest

from worker.loop import EventBus, ToolDispatcher, ToolOutcome
from worker.loop._schemas import clear_cache, schema_check
from worker.models import ToolCall
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "description": "What to look for."},
        "page": {"type": "integer", "minimum": 0},
        "sort": {"enum": ["new", "top", None]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
        "exact": {"type": "boolean", "default": False},
    },
    "required": ["query"],
    "additionalProperties": False,
}

# Schemas the compiled path takes, each with keywords whose edges differ between
# implementations if any do: integers that are floats, booleans among numbers, `$` at the
# end of a pattern, a $ref to a definition, both definition spellings, anyOf and allOf.
FAST_SCHEMAS: list[dict[str, Any]] = [
    SEARCH,
    {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}},
    {"properties": {"n": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}},
    {"properties": {"n": {"minimum": 1}, "s": {"maxLength": 2}, "a": {"maxItems": 1}}},
    {"properties": {"n": {"enum": [1, True, 1.5, "1"]}, "c": {"const": 0}}},
    {"properties": {"s": {"type": "string", "pattern": "^ab$"}}},
    {"properties": {"s": {"type": ["string", "null"]}}, "minProperties": 1, "maxProperties": 2},
    {
        "$defs": {"id": {"type": "integer", "minimum": 1}},
        "definitions": {"name": {"type": "string"}},
        "properties": {"id": {"$ref": "#/$defs/id"}, "name": {"$ref": "#/definitions/name"}},
    },
    {"properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]}}},
    {"properties": {"v": {"allOf": [{"type": "integer"}, {"minimum": 2}]}}},
    {"propertyNames": {"pattern": "^[a-z]$"}, "additionalProperties": {"type": "integer"}},
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "properties": {"n": {"type": "integer"}},
    },
]

# Keywords whose meaning differs between the two, or where a stricter check inside would
# loosen the whole: these schemas are checked by jsonschema alone.
SLOW_SCHEMAS: list[dict[str, Any]] = [
    {"properties": {"n": {"not": {"type": "integer"}}}},
    {"properties": {"n": {"oneOf": [{"type": "integer"}, {"minimum": 0}]}}},
    {"patternProperties": {"^a$": {"type": "string"}}},
    {"if": {"required": ["a"]}, "then": {"required": ["b"]}},
    {"properties": {"n": {"enum": [[1], {"a": 1}]}}},
    {"properties": {"n": {"$ref": "#/$defs/n", "minimum": 3}}, "$defs": {"n": {"type": "integer"}}},
    {"properties": {"n": {"$ref": "#/default"}}, "default": {"not": {}}},
    {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "properties": {"n": {"type": "integer"}},
    },
    {"prefixItems": [{"type": "integer"}], "unevaluatedProperties": False},
    {"properties": {"n": {"type": "integer", "x-nullable": True}}},
]

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    1.0,
    1.5,
    -3,
    2,
    "",
    "1",
    "a",
    "ab",
    "ab\n",
    "new",
    [],
    ["abc"],
    ["ABC"],
    [1, 2],
    {},
    {"a": 1},
]
NAMES = ["query", "page", "sort", "tags", "exact", "n", "c", "s", "a", "id", "name", "v", "b"]


def argument_sets() -> list[dict[str, Any]]:
    """Every name alone with every value, and pairs of them: a few thousand objects."""
    singles = [{name: value} for name in NAMES for value in VALUES]
    pairs = [{**a, **b} for a, b in itertools.combinations(singles[::3], 2)]
    return [{}, *singles, *pairs, {"query": "x", "page": 1, "unknown": 1}]


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    clear_cache()


@pytest.mark.parametrize("schema", FAST_SCHEMAS)
def test_the_compiled_path_takes_common_schemas_and_its_verdict_is_jsonschemas(
    schema: dict[str, Any],
) -> None:
    check = schema_check(schema)
    assert check.fast
    validator = jsonschema.validators.validator_for(schema)(schema)
    for arguments in argument_sets():
        expected = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        problem = check.problem(arguments)
        if expected is None:
            assert problem is None, arguments
        else:
            where = "/".join(str(p) for p in expected.absolute_path) or "arguments"
            assert problem == f"{where}: {expected.message}", arguments


@pytest.mark.parametrize("schema", SLOW_SCHEMAS)
def test_schemas_whose_keywords_differ_are_checked_by_jsonschema_alone(
    schema: dict[str, Any],
) -> None:
    check = schema_check(schema)
    assert not check.fast
    validator = jsonschema.validators.validator_for(schema)(schema)
    for arguments in argument_sets()[:200]:
        fits = validator.is_valid(arguments)
        assert (check.problem(arguments) is None) is fits, arguments


def test_a_schema_is_prepared_once_per_process_and_a_callers_later_change_is_not_seen() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    first = schema_check(schema)
    assert schema_check({"type": "object", "properties": {"n": {"type": "integer"}}}) is first
    schema["properties"] = {"n": {"type": "string"}}  # the caller's dict, changed afterwards
    assert first.problem({"n": 1}) is None
    changed = schema_check(schema)
    assert changed is not first
    assert changed.problem({"n": 1}) == "n: 1 is not of type 'string'"


def test_the_same_schema_in_another_key_order_keeps_its_own_words() -> None:
    ordered = {"properties": {"v": {"const": {"a": 1, "b": 2}}}}
    reordered = {"properties": {"v": {"const": {"b": 2, "a": 1}}}}
    assert schema_check(ordered).problem({"v": 0}) == "v: {'a': 1, 'b': 2} was expected"
    assert schema_check(reordered).problem({"v": 0}) == "v: {'b': 2, 'a': 1} was expected"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "integr"}}},
        {"type": "object", "properties": {"n": {"minimum": "zero"}}},
        {"type": "object", "required": "n"},
    ],
)
def test_a_broken_schema_checks_nothing_in_every_task(schema: dict[str, Any]) -> None:
    assert schema_check(schema).problem({"n": "anything"}) is None
    assert schema_check(schema).problem({}) is None


async def test_tasks_share_the_prepared_schema_and_the_model_reads_jsonschemas_words() -> None:
    tool = LocalTool(name="search", function=lambda **kw: "found", input_schema=SEARCH)
    records = []
    for task in ("t-1", "t-2"):
        dispatcher = ToolDispatcher(
            LocalToolbox([tool]),
            task_id=task,
            agent_id="agent-a",
            events=EventBus(),
            max_output_chars=1000,
        )
        for arguments in ('{"query": "cats", "page": 1}', '{"query": "cats", "page": -1}'):
            call = ToolCall(id=f"{task}-{arguments}", name="search", arguments=arguments)
            records.append(await dispatcher.run(1, 1, call, 5.0))
    assert [record.outcome for record in records] == [
        ToolOutcome.OK,
        ToolOutcome.INVALID_ARGUMENTS,
    ] * 2
    assert (
        records[1].content
        == records[3].content
        == ("Error: invalid arguments for tool 'search': page: -1 is less than the minimum of 0")
    )
    assert schema_check(SEARCH).fast
