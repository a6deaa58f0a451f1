"""Every key of an agent's ``config.yaml``, from the JSON Schema ``agent-worker schema`` prints.

A key whose description opens with ``This worker's extension:`` is ours, and so is every
key under it; the others are the public Botburrow format's (``Declined:`` marks the one
the worker knowingly refuses).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from worker.agents import config_json_schema
from worker.dev.docs._markdown import breakable_name, code, table

EXTENSION = "This worker's extension:"
DECLINED = "Declined:"


@dataclass(frozen=True, kw_only=True)
class Key:
    path: str
    kind: str
    default: str
    origin: str
    description: str


def _section(field: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a field holds (directly, optionally, or as list items)."""
    candidates = [field, *field.get("anyOf", []), field.get("items") or {}]
    for candidate in candidates:
        ref = candidate.get("$ref")
        if isinstance(ref, str):
            section: dict[str, Any] = defs[ref.rsplit("/", 1)[-1]]
            return section
    return None


def _kind(field: dict[str, Any]) -> str:
    options = field.get("anyOf", [field])
    kinds = []
    for option in options:
        if "$ref" in option:
            kinds.append("object")
        elif "enum" in option:
            kinds.append(" | ".join(json.dumps(value) for value in option["enum"]))
        elif option.get("type") == "array":
            kinds.append("list")
        elif "type" in option:
            kinds.append(str(option["type"]))
    return " or ".join(kind for kind in kinds if kind != "null") or "any"


def _default(field: dict[str, Any]) -> str:
    if "default" not in field or field["default"] is None:
        return "—"
    if isinstance(field["default"], dict):
        # Each key of a section has its own row and default; the section's whole default
        # (600 characters for `behavior`) would only repeat them.
        return "its keys'"
    return code(json.dumps(field["default"]))


def _keys(
    schema: dict[str, Any], defs: dict[str, Any], prefix: str, inherited: str
) -> Iterator[Key]:
    for name, field in schema.get("properties", {}).items():
        description = str(field.get("description", ""))
        origin = inherited
        if description.startswith(EXTENSION):
            origin, description = "extension", description.removeprefix(EXTENSION).strip()
        elif description.startswith(DECLINED):
            origin, description = "declined", description.removeprefix(DECLINED).strip()
        path = f"{prefix}{name}"
        yield Key(
            path=path,
            kind=_kind(field),
            default=_default(field),
            origin=origin,
            description=description,
        )
        section = _section(field, defs)
        if section is not None:
            yield from _keys(
                section, defs, f"{path}.", "extension" if origin == "extension" else "public"
            )


def definition_keys() -> list[Key]:
    schema = config_json_schema()
    return list(_keys(schema, schema.get("$defs", {}), "", "public"))


def definition_table() -> str:
    rows = [
        (breakable_name(key.path), key.kind, key.default, key.origin, key.description)
        for key in definition_keys()
    ]
    return table(("key", "type", "default", "format", "meaning"), rows)


def undocumented_keys() -> list[str]:
    return [key.path for key in definition_keys() if not key.description.strip()]
