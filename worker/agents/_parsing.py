"""Bytes of a definition file → validated values, or an AgentConfigError naming file and field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.agents._config import AgentConfig
from worker.agents._definition import Skill
from worker.agents._keys import shadowed_nested_switches, unknown_keys
from worker.agents._policy import DefinitionPolicy
from worker.agents._yaml import load_yaml
from worker.exceptions import AgentConfigError
from worker.task import describe_validation_error

_FRONT_MATTER_FENCE = "---"


class _SkillFrontMatter(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=100)
    description: str = Field(min_length=1, max_length=2_000)


def decode_text(raw: bytes, file: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AgentConfigError(
            f"{file}: not valid UTF-8 (bad byte at offset {exc.start})"
        ) from None


@dataclass(frozen=True, slots=True)
class ParsedConfig:
    config: AgentConfig
    # One per unknown key (naming the file and the key's dotted path) or ignored nested switch.
    warnings: tuple[str, ...]


def parse_config(
    raw: bytes, file: str, expected_name: str, policy: DefinitionPolicy
) -> ParsedConfig:
    """``agents/<expected_name>/config.yaml``; its ``name`` must be its directory's name,
    and what it chooses must be within the operator's ``policy``."""
    document = _yaml_mapping(decode_text(raw, file), file)
    try:
        config = AgentConfig.model_validate(document)
    except ValidationError as exc:
        raise AgentConfigError(f"{file}: {describe_validation_error(exc)}") from None
    if config.name != expected_name:
        raise AgentConfigError(
            f"{file}: name: {config.name!r} must equal its directory name {expected_name!r}"
        )
    policy.check(config, file)
    unknown = unknown_keys(document, AgentConfig)
    if unknown and policy.strict:
        raise AgentConfigError(f"{file}: {unknown[0]} (AGENTS_STRICT refuses unknown keys)")
    messages = [*unknown, *shadowed_nested_switches(document)]
    warnings = tuple(f"{file}: {message}" for message in messages)
    return ParsedConfig(config=config, warnings=warnings)


def parse_skill(raw: bytes, file: str) -> Skill:
    """A ``SKILL.md``: YAML front matter between ``---`` lines, then the instructions."""
    text = decode_text(raw, file)
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != _FRONT_MATTER_FENCE:
        raise AgentConfigError(
            f"{file}: must start with YAML front matter between '---' lines (name, description)"
        )
    closing = next(
        (i for i in range(1, len(lines)) if lines[i].strip() == _FRONT_MATTER_FENCE), None
    )
    if closing is None:
        raise AgentConfigError(f"{file}: front matter has no closing '---' line")
    front_matter = _yaml_mapping("".join(lines[1:closing]), file, first_line=2)
    try:
        fields = _SkillFrontMatter.model_validate(front_matter)
    except ValidationError as exc:
        raise AgentConfigError(f"{file}: front matter: {describe_validation_error(exc)}") from None
    return Skill(
        name=fields.name,
        description=fields.description.strip(),
        instructions="".join(lines[closing + 1 :]).strip(),
    )


def _yaml_mapping(text: str, file: str, *, first_line: int = 1) -> dict[str, Any]:
    document = load_yaml(text, file, first_line=first_line)
    if document is None:
        raise AgentConfigError(f"{file}: is empty; expected a YAML mapping")
    if not isinstance(document, dict):
        raise AgentConfigError(
            f"{file}: expected a YAML mapping at the top level, got {_yaml_kind(document)}"
        )
    return document


def _yaml_kind(document: object) -> str:
    if isinstance(document, list):
        return "a list"
    if isinstance(document, str):
        return "a string"
    return type(document).__name__
