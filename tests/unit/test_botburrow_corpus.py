"""A corpus of definitions in the public Botburrow format (tests/fixtures/botburrow): each loads
with no error and no warning, validates against ``agent-worker schema``, and together they use
every key of the public schema (version 1.0.0).

Every definition the project teaches (this corpus, the demo agent, docs/first-agent.md's
hello-agent) also validates against ``agent-worker schema --public``: the public format
alone, this worker's extensions refused, as other Botburrow runners read it. The one
exception is nested-notifier, written in the nested form some Botburrow examples use."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.definitions import write_agent
from worker.agents import AgentStore, DefinitionPolicy
from worker.executors import CliExecutor, executor_for
from worker.executors._sandbox import sandbox_problem
from worker.operations._checks import run_checks
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "botburrow"
GUIDE = REPO / "docs" / "first-agent.md"
DEMO_AGENT = REPO / "worker" / "dev" / "demo" / "agents" / "agents" / "demo-agent" / "config.yaml"
# The corpus's definition in the nested form: this worker's extension, not the public format.
NESTED_FORM = "nested-notifier"
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


@pytest.fixture(scope="module")
def public_schema() -> dict[str, Any]:
    """What ``agent-worker schema --public`` prints."""
    done = subprocess.run(
        [AGENT_WORKER, "schema", "--public"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    schema: dict[str, Any] = json.loads(done.stdout)
    return schema


def schema_keys(
    schema: Mapping[str, Any], section: Mapping[str, Any], prefix: str = ""
) -> Iterator[str]:
    """The dotted path of every key of ``section`` (a schema's object), through its $refs."""
    for key, field in section.get("properties", {}).items():
        target = field
        if "$ref" in field:
            target = schema["$defs"][field["$ref"].rsplit("/", 1)[-1]]
        if "properties" in target:
            yield from schema_keys(schema, target, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def taught_definitions() -> dict[str, dict[str, Any]]:
    """Every config.yaml the project teaches, by where it is."""
    guide = re.search(
        r"cat > my-agents/agents/hello-agent/config.yaml <<'EOF'\n(.*?)\nEOF",
        GUIDE.read_text(),
        re.S,
    )
    assert guide is not None
    taught = {f"corpus {name}": document for name, document in documents().items()}
    del taught[f"corpus {NESTED_FORM}"]
    taught["docs/first-agent.md hello-agent"] = yaml.safe_load(guide.group(1))
    taught["demo-agent"] = yaml.safe_load(DEMO_AGENT.read_text())
    return taught


def test_the_public_schema_has_exactly_the_public_keys(public_schema: dict[str, Any]) -> None:
    assert set(schema_keys(public_schema, public_schema)) == PUBLIC_KEYS
    assert public_schema["required"] == ["name", "type", "brain", "capabilities"]


@pytest.mark.parametrize("where", sorted(taught_definitions()))
def test_every_taught_definition_validates_against_the_public_schema(
    where: str, public_schema: dict[str, Any]
) -> None:
    validator = jsonschema.Draft202012Validator(public_schema)
    assert [error.message for error in validator.iter_errors(taught_definitions()[where])] == []


def test_the_nested_form_is_outside_the_public_format_only_for_its_nested_switches(
    public_schema: dict[str, Any],
) -> None:
    validator = jsonschema.Draft202012Validator(public_schema)
    errors = [error.message for error in validator.iter_errors(documents()[NESTED_FORM])]
    assert errors == ["Additional properties are not allowed ('notifications' was unexpected)"]


@pytest.mark.parametrize(
    ("key", "value", "advice"),
    [
        ("brain.provider", "google", "use openai with an OpenAI-compatible endpoint"),
        ("brain.provider", "local", "use openai with brain.api_base"),
        ("type", "custom", "use native, or a coding-agent CLI"),
    ],
)
def test_a_public_value_this_worker_cannot_run_is_one_line_of_check_saying_so(
    tmp_path: Path, public_schema: dict[str, Any], key: str, value: str, advice: str
) -> None:
    document = yaml.safe_load(DEMO_AGENT.read_text())
    section, _, field = key.rpartition(".")
    (document[section] if section else document)[field] = value
    jsonschema.Draft202012Validator(public_schema).validate(document)  # the format allows it
    document["capabilities"]["skills"] = []  # the demo's skill is not written here
    write_agent(tmp_path, "demo-agent", document)

    done = subprocess.run(
        [AGENT_WORKER, "check", "--offline"],
        env={**os.environ, "AGENTS_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 1
    (line,) = [line for line in done.stdout.splitlines() if f"{value!r}" in line]
    assert "agents/demo-agent/config.yaml" in line and f"{key}: {value!r} is in the public" in line
    assert advice in line


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


def test_agent_worker_check_finds_nothing_to_say(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The operator has set both providers' keys (check reports an agent whose key is unset)
    # and installed the CLIs the CLI agents run (check reports one missing from PATH): this
    # host's own PATH may have them or not.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-corpus-7Qf2Lr9Xw4Tz1Vb8")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-corpus-3Hd8Nq5Ke2Wm7Yp4")
    cli_agents = []
    for name in AGENTS:
        executor = executor_for(AgentStore(str(CORPUS), ttl_s=0).load(name).config.type)
        if isinstance(executor, CliExecutor):
            cli_agents.append(name)
            installed = tmp_path / executor.binary
            installed.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
            installed.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    settings = Settings(agents_dir=str(CORPUS))  # type: ignore[call-arg]
    report = run_checks(settings, redis=False, network=False)

    # Only a host that cannot sandbox CLIs (no bubblewrap) adds a line for each CLI agent.
    host = sandbox_problem(settings)
    expected = [
        f"error: CLI_SANDBOX: {host} — agent {name}'s tasks fail until it works"
        for name in sorted(cli_agents)
        if host is not None
    ]
    assert [problem.line() for problem in report.problems] == expected
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
