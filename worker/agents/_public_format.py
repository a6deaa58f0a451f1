"""The public Botburrow agent-definitions format, against what this worker reads of it.

A definition written for every Botburrow runner loads here; what this worker adds is
marked (``EXTENSION_MARK``) and left out of the public schema, and a value the format
allows but this worker cannot run is refused in one line saying what to use instead.
``worker.agents._config`` holds the fields themselves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

# Values the public format allows that this worker cannot run: each refused in one line
# saying so and what to use instead, not with the generic "Input should be ...".
UNSUPPORTED_PUBLIC_VALUES = {
    "provider": {
        "google": "use openai with an OpenAI-compatible endpoint (brain.api_base) or anthropic",
        "local": "use openai with brain.api_base (or OPENAI_BASE_URL) at the local server",
    },
    "type": {
        "custom": "use native, or a coding-agent CLI: claude-code, goose, aider or opencode",
    },
}
# A key whose description starts so is this worker's, not the public format's
# (``public_json_schema`` leaves them out); and a value that is only this worker's.
EXTENSION_MARK = "This worker's extension"
EXTENSION_TYPES = frozenset({"opencode"})
# What the public format requires (this worker defaults type and capabilities).
PUBLIC_REQUIRED = ("name", "type", "brain", "capabilities")


def refuse_unsupported(field: str, value: Any) -> Any:
    """``value`` unless the public format allows it and this worker does not run it."""
    advice = UNSUPPORTED_PUBLIC_VALUES[field].get(value) if isinstance(value, str) else None
    if advice is not None:
        raise ValueError(
            f"{value!r} is in the public Botburrow format but this worker does not support it: "
            f"{advice}"
        )
    return value


def public_schema(
    full_schema: dict[str, Any], *, agent_types: Sequence[str], providers: Sequence[str]
) -> dict[str, Any]:
    """``full_schema`` (this worker's, ``config_json_schema``) cut to the public format."""
    schema = copy.deepcopy(full_schema)
    schema["title"] = "Botburrow agent definition (config.yaml), the public format"
    for section in [schema, *schema["$defs"].values()]:
        properties = section.get("properties")
        if properties is None:
            continue
        for key, field in list(properties.items()):
            if str(field.get("description", "")).startswith(EXTENSION_MARK):
                del properties[key]
        section["additionalProperties"] = False
    schema["required"] = list(PUBLIC_REQUIRED)
    types = [t for t in agent_types if t not in EXTENSION_TYPES]
    schema["properties"]["type"]["enum"] = [*types, *UNSUPPORTED_PUBLIC_VALUES["type"]]
    provider = schema["$defs"]["Brain"]["properties"]["provider"]
    provider["enum"] = [*providers, *UNSUPPORTED_PUBLIC_VALUES["provider"]]
    # Sections only extensions used (Limits, Fallback, ...) go too, until none is unused.
    while unused := _unreferenced_sections(schema):
        for name in unused:
            del schema["$defs"][name]
    return schema


def _unreferenced_sections(schema: dict[str, Any]) -> list[str]:
    text = json.dumps([schema["properties"], *schema["$defs"].values()])
    return [name for name in schema["$defs"] if f'"#/$defs/{name}"' not in text]
