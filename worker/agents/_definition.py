"""A loaded agent: its config, its system prompt and the skills it lists, in order."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.agents._config import AgentConfig


@dataclass(slots=True, frozen=True)
class Skill:
    """One ``skills/<name>/SKILL.md``: front matter ``name`` and ``description``, then the body."""

    name: str
    description: str
    instructions: str


@dataclass(slots=True, frozen=True)
class AgentDefinition:
    config: AgentConfig
    system_prompt: str
    skills: list[Skill] = field(default_factory=list)
    # Unknown keys of config.yaml, each naming the file and dotted path (``agent-worker check``).
    warnings: tuple[str, ...] = ()

    def full_system_prompt(self) -> str:
        """What the model gets as its system prompt: the agent's own, then each skill's."""
        sections = [self.system_prompt.strip()]
        for skill in self.skills:
            sections.append(
                f"# Skill: {skill.name}\n\n"
                f"Description: {skill.description}\n\n"
                f"{skill.instructions.strip()}"
            )
        return "\n\n".join(section for section in sections if section)

    def files(self) -> list[str]:
        """The files it was read from, relative to AGENTS_DIR."""
        folder = f"agents/{self.config.name}"
        skills = [f"skills/{name}/SKILL.md" for name in self.config.capabilities.skills]
        return [f"{folder}/config.yaml", f"{folder}/system-prompt.md", *skills]


# Bump when the cached shape changes, so old entries read as misses.
_CACHE_FORMAT = 3
# The files of a definition as they are now (``DefinitionSource.version``).
FilesVersion = Callable[[AgentDefinition], "str | None"]


def definition_to_json(
    definition: AgentDefinition, source: str, policy: str, files: str | None
) -> str:
    """The cache entry; ``source`` and ``policy`` (the operator rules it was checked
    under) tell entries written for another AGENTS_DIR or another host's rules apart,
    ``files`` (the version of its files when read) an entry whose files changed since."""
    return json.dumps(
        {
            "format": _CACHE_FORMAT,
            "source": source,
            "policy": policy,
            "files": files,
            "config": definition.config.model_dump(mode="json"),
            "system_prompt": definition.system_prompt,
            "skills": [
                {"name": s.name, "description": s.description, "instructions": s.instructions}
                for s in definition.skills
            ],
            "warnings": list(definition.warnings),
        },
        separators=(",", ":"),
        ensure_ascii=False,  # \uXXXX escapes would make a prompt's entry up to six times larger
    )


def definition_from_json(
    raw: str | bytes, source: str, policy: str, files: FilesVersion
) -> AgentDefinition | None:
    """The definition in a cache entry, or None when the entry is stale (its files changed
    since they were read), foreign or damaged."""
    try:
        entry: Any = json.loads(raw)
        if (entry.get("format"), entry.get("source"), entry.get("policy")) != (
            _CACHE_FORMAT,
            source,
            policy,
        ):
            return None
        definition = AgentDefinition(
            config=AgentConfig.model_validate(entry["config"]),
            system_prompt=str(entry["system_prompt"]),
            skills=[
                Skill(
                    name=str(s["name"]),
                    description=str(s["description"]),
                    instructions=str(s["instructions"]),
                )
                for s in entry["skills"]
            ],
            warnings=tuple(str(warning) for warning in entry["warnings"]),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        # pydantic's ValidationError is a ValueError: an entry from an older release.
        return None
    return definition if entry.get("files") == files(definition) else None
