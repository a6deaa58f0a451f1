"""Tool-argument checks against a tool's input schema, compiled once per process.

jsonschema walks the schema for every call (a validator object per sub-schema), a sizeable
share of a loop step. Tools keep their schemas from task to task, so each schema is
prepared once per process, keyed by its JSON text:

- jsonschema's validator, which gives the verdict and writes the message the model reads
  whenever arguments are not accepted at once;
- for schemas made only of keywords whose meaning is the same in fastjsonschema's draft 7
  and in the drafts jsonschema applies (``FAST_KEYWORDS``), a fastjsonschema function
  compiled to Python: a few µs per call. It may only *accept*: anything it rejects, or
  any schema it cannot compile, goes to jsonschema: no rejection rests on it.

The keywords left out are those where the two differ, or where a stricter check inside
would make the whole looser (``not``, ``oneOf``, ``if``; ``patternProperties``, whose
patterns fastjsonschema anchors with ``\\Z`` instead of ``$``).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable
from typing import Any

import fastjsonschema
import jsonschema
from jsonschema.protocols import Validator

# Schemas kept per process: far more than the tools one worker is configured with.
CACHE_SIZE = 512

# The drafts whose integer (1.0 is one), exclusiveMinimum (a number) and $ref are
# fastjsonschema's draft 7; no ``$schema`` means jsonschema's latest (2020-12).
_SAME_DRAFTS = frozenset(
    {
        "http://json-schema.org/draft-06/schema#",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    }
)
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# Words that never change a verdict (``format`` is not asserted by either side).
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    }
)
_NUMBERS = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    }
)
_ONE_SCHEMA = frozenset({"items", "additionalProperties", "propertyNames"})
_SCHEMA_LISTS = frozenset({"anyOf", "allOf"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions"})
FAST_KEYWORDS = (
    _ANNOTATIONS
    | _NUMBERS
    | _ONE_SCHEMA
    | _SCHEMA_LISTS
    | _SCHEMA_MAPS
    | {"type", "required", "pattern", "enum", "const", "$ref", "$schema"}
)


class SchemaCheck:
    """The checks of one input schema; shared by every task of the process, never changed
    but for remembering whether the schema itself is sound."""

    __slots__ = ("_fast", "_sound", "schema", "validator")

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        cls = jsonschema.validators.validator_for(schema)
        self.validator: Validator = cls(schema)
        self._fast = _compile_fast(schema)
        self._sound: bool | None = None

    def problem(self, arguments: dict[str, Any]) -> str | None:
        """What is wrong with ``arguments``, as jsonschema words it; None when they fit.

        A schema that is itself broken checks nothing (its tool runs unchecked). Checking a
        schema against its meta-schema costs about a millisecond, so it is done only when it
        matters: when the arguments fail the schema, or the schema fails to apply.
        """
        if self._sound is False:
            return None
        fast = self._fast
        if fast is not None:
            try:
                fast(arguments)
            except Exception:  # not accepted at once: jsonschema decides, and says why
                pass
            else:
                return None
        try:
            error = jsonschema.exceptions.best_match(self.validator.iter_errors(arguments))
        except Exception:
            if not self._is_sound():
                return None
            raise
        if error is None or not self._is_sound():
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return f"{where}: {error.message}"

    @property
    def fast(self) -> bool:
        """Whether arguments this schema accepts are accepted without jsonschema's walk."""
        return self._fast is not None

    def _is_sound(self) -> bool:
        if self._sound is None:
            try:
                self.validator.check_schema(self.schema)
            except jsonschema.exceptions.SchemaError:
                self._sound = False  # a server with a broken schema: its tools run unchecked
            else:
                self._sound = True
        return self._sound


def schema_check(schema: dict[str, Any]) -> SchemaCheck:
    """The process's checks for ``schema``, prepared on first use.

    Keyed by the schema's JSON text in its own key order: the same tool's schema is the
    same text in every task, and jsonschema's messages (which quote parts of the schema)
    stay exactly those of this schema. A schema that is not JSON is prepared uncached.
    """
    try:
        key = json.dumps(schema, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return SchemaCheck(copy.deepcopy(schema))
    return _cached(key)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached(key: str) -> SchemaCheck:
    # A copy of its own: a caller changing its dict later cannot change the cached checks.
    schema: dict[str, Any] = json.loads(key)
    return SchemaCheck(schema)


def clear_cache() -> None:
    """Forget every prepared schema (tests; a process never needs to)."""
    _cached.cache_clear()


def _compile_fast(schema: dict[str, Any]) -> Callable[[Any], Any] | None:
    if not isinstance(schema, dict) or not _fast_safe(schema, schema):
        return None
    definition = {key: value for key, value in schema.items() if key != "$schema"}
    try:
        # Defaults never filled in (the model's arguments go to the tool as written).
        return fastjsonschema.compile(definition, use_default=False, use_formats=False)
    except Exception:  # a schema fastjsonschema cannot compile: jsonschema alone checks it
        return None


def _fast_safe(schema: Any, root: dict[str, Any]) -> bool:
    """Whether every keyword of ``schema`` (and its sub-schemas) means the same to both."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        if keyword not in FAST_KEYWORDS or not _keyword_safe(keyword, value, schema, root):
            return False
    return True


def _keyword_safe(keyword: str, value: Any, schema: dict[str, Any], root: dict[str, Any]) -> bool:
    if keyword in _ANNOTATIONS:
        return True
    if keyword == "$schema":
        return schema is root and value in _SAME_DRAFTS
    if keyword in _NUMBERS:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if keyword in _ONE_SCHEMA:
        return _fast_safe(value, root)
    if keyword in _SCHEMA_LISTS:
        return isinstance(value, list) and bool(value) and all(_fast_safe(s, root) for s in value)
    if keyword in _SCHEMA_MAPS:
        return isinstance(value, dict) and all(
            isinstance(name, str) and _fast_safe(s, root) for name, s in value.items()
        )
    if keyword == "type":
        kinds = value if isinstance(value, list) else [value]
        return bool(kinds) and all(isinstance(kind, str) and kind in _TYPES for kind in kinds)
    if keyword == "required":
        return isinstance(value, list) and all(isinstance(name, str) for name in value)
    if keyword == "pattern":
        return isinstance(value, str)
    if keyword == "enum":
        return isinstance(value, list) and all(_scalar(item) for item in value)
    if keyword == "const":
        return _scalar(value)
    if keyword == "$ref":
        # The root or one of its definitions (schemas walked here), alone but for
        # annotations: draft 7 ignores a $ref's siblings.
        return _ref_safe(value, root) and all(
            key == "$ref" or key in _ANNOTATIONS for key in schema
        )
    return False


_DEFINITION_REF = re.compile(r"#/(\$defs|definitions)/([A-Za-z0-9_.-]+)")


def _ref_safe(ref: Any, root: dict[str, Any]) -> bool:
    if ref == "#":
        return True
    matched = _DEFINITION_REF.fullmatch(ref) if isinstance(ref, str) else None
    if matched is None:
        return False
    definitions = root.get(matched[1])
    return isinstance(definitions, dict) and matched[2] in definitions


def _scalar(value: Any) -> bool:
    """Compared alike by both (containers are not: ``[1] == [True]`` in Python)."""
    return value is None or isinstance(value, str | int | float)
