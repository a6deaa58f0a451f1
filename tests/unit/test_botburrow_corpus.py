"""A corpus of definitions in the public Botburrow format (tests/fixtures/botburrow): each loads
with no error and no warning, validates against ``agent-worker schema``, and together they use
every key of the public schema (version 1.0.0)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from worker.agents import AgentStore, DefinitionPolicy
from worker.operations import run_checks
from worker.settings import Settings

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "botburrow"
AGENT_WORKER = str(Path(sys.executable).parent / "agent-worker")

# Every key of the public agent-definitions schema 1.0.0, by dotted path.
PUBLIC_KEYS = frozenset(
    {
        "version",
        "cache_ttl",
        "name",
        "display_name",
        "description",
        "type",
        "brain.provider",
        "brain.model",
        "brain.api_base",
        "brain.api_key_env",
        "brain.temperature",
        "brain.max_tokens",
        "capabilities.grants",
        "capabilities.skills",
        "capabilities.mcp_servers",
        "capabilities.shell.enabled",
        "capabilities.shell.allowed_commands",
        "capabilities.shell.blocked_patterns",
        "capabilities.shell.timeout_seconds",
        "capabilities.spawning.can_propose",
        "capabilities.spawning.allowed_templates",
        "interests.topics",
        "interests.communities",
        "interests.keywords",
        "interests.follow_agents",
        "behavior.respond_to_mentions",
        "behavior.respond_to_replies",
        "behavior.respond_to_dms",
        "behavior.max_iterations",
        "behavior.discovery.enabled",
        "behavior.discovery.frequency",
        "behavior.discovery.respond_to_questions",
        "behavior.discovery.respond_to_discussions",
        "behavior.discovery.min_confidence",
        "behavior.limits.max_daily_posts",
        "behavior.limits.max_daily_comments",
        "behavior.limits.max_responses_per_thread",
        "behavior.limits.min_interval_seconds",
        "memory.enabled",
        "memory.remember.conversations_with",
        "memory.remember.projects_worked_on",
        "memory.remember.decisions_made",
        "memory.remember.feedback_received",
        "memory.max_size_mb",
        "memory.retrieval.strategy",
        "memory.retrieval.max_context_items",
        "memory.retrieval.relevance_threshold",
    }
)
AGENTS = sorted(path.name for path in (CORPUS / "agents").iterdir())


def documents() -> dict[str, dict[str, Any]]:
    return {
        name: yaml.safe_load((CORPUS / "agents" / name / "config.yaml").read_text())
        for name in AGENTS
    }


def leaf_paths(document: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in document.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from leaf_paths(value, f"{path}.")
        else:
            yield path


@pytest.fixture(scope="module")
def cli_schema() -> dict[str, Any]:
    """What ``agent-worker schema`` prints."""
    done = subprocess.run(
        [AGENT_WORKER, "schema"], capture_output=True, text=True, timeout=120, check=True
    )
    schema: dict[str, Any] = json.loads(done.stdout)
    return schema


def test_the_corpus_has_the_definitions_the_format_calls_for() -> None:
    loaded = {name: AgentStore(str(CORPUS), ttl_s=0).load(name).config for name in AGENTS}

    assert len(AGENTS) >= 6
    assert loaded["official-native"].brain.api_base == "https://api.openai.com/v1"
    assert loaded["anthropic-analyst"].brain.provider == "anthropic"
    assert loaded["claude-coder"].type == "claude-code"
    assert loaded["claude-coder"].capabilities.shell.enabled
    persona = loaded["quiet-persona"].behavior
    assert persona.respond_to_dms is False and persona.limits.max_responses_per_thread == 2
    assert "notifications" in documents()["nested-notifier"]["behavior"]
    assert loaded["nested-notifier"].behavior.respond_to_replies is False
    assert loaded["memory-keeper"].memory.enabled


def test_together_they_use_every_public_key() -> None:
    used = {path for document in documents().values() for path in leaf_paths(document)}
    assert PUBLIC_KEYS - used == set()


@pytest.mark.parametrize("name", AGENTS)
def test_each_loads_with_no_error_and_no_warning(name: str) -> None:
    # The operator's default rules: no endpoint or key variable allowed beyond the providers'.
    store = AgentStore(str(CORPUS), ttl_s=0, policy=DefinitionPolicy(strict=True))
    assert store.load(name).warnings == ()


def test_agent_worker_check_finds_nothing_to_say(monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator has set both providers' keys (check reports an agent whose key is unset).
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-corpus-7Qf2Lr9Xw4Tz1Vb8")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-corpus-3Hd8Nq5Ke2Wm7Yp4")
    report = run_checks(Settings(agents_dir=str(CORPUS)), redis=False, network=False)  # type: ignore[call-arg]

    assert [problem.line() for problem in report.problems] == []
    assert f"{len(AGENTS)} of {len(AGENTS)} agent definitions load" in report.checked


@pytest.mark.parametrize("name", AGENTS)
def test_each_validates_against_agent_worker_schema(name: str, cli_schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(cli_schema).validate(documents()[name])


def test_the_schema_catches_what_loading_refuses(cli_schema: dict[str, Any]) -> None:
    wrong = {**documents()["quiet-persona"], "behavior": {"limits": {"max_daily_posts": -1}}}
    with pytest.raises(jsonschema.ValidationError, match="-1 is less than the minimum of 0"):
        jsonschema.Draft202012Validator(cli_schema).validate(wrong)


def test_every_key_of_the_schema_has_a_description_and_the_optional_ones_a_default(
    cli_schema: dict[str, Any],
) -> None:
    sections = [cli_schema, *cli_schema["$defs"].values()]
    undocumented = [
        f"{section.get('title', 'config')}.{key}"
        for section in sections
        for key, field in section.get("properties", {}).items()
        if "description" not in field
        or (key not in section.get("required", []) and "default" not in field)
    ]
    assert undocumented == []


def test_the_schema_next_to_the_corpus_is_the_current_one(cli_schema: dict[str, Any]) -> None:
    # The modeline of official-native/config.yaml points editors at this file.
    shipped = json.loads((CORPUS / "agent-config.schema.json").read_text())
    assert shipped == cli_schema, "regenerate it: agent-worker schema > <that file>"
