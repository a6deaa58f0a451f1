"""The reference tables of the docs are complete: written from the code, each entry described."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.daemon.pool._supervisor import _PoolCollector
from worker.dev import docs
from worker.dev.docs import _settings, hooks
from worker.dev.docs._commands import commands
from worker.dev.docs._definition import definition_keys
from worker.metrics._families import GAUGES
from worker.metrics._recorders import WorkerMetrics
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "botburrow" / "agents"


def test_every_setting_key_flag_metric_and_outcome_has_a_description() -> None:
    assert docs.undocumented() == [], "describe them in the code (docs/development.md)"


def test_a_setting_without_a_docstring_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class WithAnUndescribedSetting(Settings):
        brand_new_knob: int = 3

    monkeypatch.setattr(_settings, "Settings", WithAnUndescribedSetting)
    assert _settings.undocumented_settings() == ["BRAND_NEW_KNOB"]
    assert "setting: BRAND_NEW_KNOB" in docs.undocumented()


def test_the_settings_reference_has_every_variable_with_its_default() -> None:
    table = docs.render("settings")
    for name in Settings.model_fields:
        assert f"| `{name.upper()}` |" in table
    assert "| `WORKER_CONCURRENCY` | `1` |" in table
    assert "| `STRICT_GRANTS` | `false` |" in table
    # A secret's default is never printed, and neither is a value from this environment.
    assert "| `HUB_API_KEY` | — |" in table


def test_the_command_reference_has_every_subcommand_and_its_flags() -> None:
    table = docs.render("commands")
    names = {command.name for command in commands()}
    for expected in (
        "agent-worker check",
        "agent-worker memory",
        "agent-worker dead-letters replay",
        "agent-worker devhub",
        "agent-worker executors",
    ):
        assert expected in names
    for flag in ("--offline", "--rerun", "--about NAME", "--failures N", "--redis-url URL"):
        assert f"`{flag}" in table


def test_reading_a_commands_parser_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    commands()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


class _StubPool:
    processes = 2

    def running(self) -> int:
        return 2

    def restarts(self) -> int:
        return 0


def _exported_families() -> set[str]:
    """The families a host's /metrics serves (a worker's, the Redis gauges and the pool's), as
    prometheus-client names them (counters without _total)."""
    registry_names = {family.name for family in WorkerMetrics().registry.collect()}
    pool_names = {family.name for family in _PoolCollector(_StubPool()).collect()}  # type: ignore[arg-type]
    return registry_names | set(GAUGES) | pool_names


def test_the_metric_reference_lists_exactly_what_the_worker_exports() -> None:
    table = docs.render("metrics")
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert {name.removesuffix("_total") for name in listed} == _exported_families()


def _keys_used(node: Any, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return set()
    used = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        used.add(path)
        items = value if isinstance(value, list) else [value]
        for item in items:
            used |= _keys_used(item, f"{path}.")
    return used


def test_every_public_key_is_one_the_public_format_definitions_use() -> None:
    # The corpus, written as Botburrow users write definitions, uses every public key (its
    # README); the keys marked as this worker's extensions are the rest.
    used: set[str] = set()
    for config in CORPUS.glob("*/config.yaml"):
        used |= _keys_used(yaml.safe_load(config.read_text(encoding="utf-8")))
    origins = {key.path: key.origin for key in definition_keys()}
    public = {path for path, origin in origins.items() if origin in {"public", "declined"}}
    extensions = {path for path, origin in origins.items() if origin == "extension"}
    assert used <= set(origins), "a key the reference does not list"
    assert public - used == set(), "a public key the corpus does not use"
    assert {"brain.fallbacks", "limits.max_tokens", "behavior.notifications.respond_to_dms"} <= (
        extensions
    )


def test_the_build_hook_writes_each_marker_and_refuses_an_unknown_one() -> None:
    page = "# Outcomes\n\n<!-- reference: outcomes -->\n\nAfter."
    written = hooks.on_page_markdown(page)
    assert "| `tool_loop` | finished | yes |" in written and written.endswith("After.")
    with pytest.raises(ValueError, match="no reference named 'setings'"):
        hooks.on_page_markdown("<!-- reference: setings -->")


EXTERNAL_LINK = re.compile(r"\]\((https?:)?//|<https?://|href=\"https?://")


def test_the_docs_stand_alone_linking_only_to_each_other() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    linking_out = [str(page) for page in pages if EXTERNAL_LINK.search(page.read_text())]
    assert linking_out == []


def test_the_variables_the_readme_names_are_settings() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Configuration in brief")[1].split("\n## ")[0]
    named = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", section))
    assert len(named) >= 10
    assert named - {name.upper() for name in Settings.model_fields} == set()


def test_definition_keys_break_only_after_a_dot_or_an_underscore() -> None:
    table = docs.render("definition")
    assert "| <code>brain.<wbr>fallbacks.<wbr>provider</code> |" in table
    assert "| <code>brain.<wbr>api_<wbr>key_<wbr>env</code> |" in table
    assert "`brain.provider`" not in table


def test_a_sections_default_is_its_keys_not_its_whole_object() -> None:
    rows = {line.split(" | ")[0]: line for line in docs.render("definition").splitlines()}
    behavior = rows["| <code>behavior</code>"]
    assert "| its keys' |" in behavior and "respond_to_mentions" not in behavior
    assert "| `10` |" in rows["| <code>behavior.<wbr>max_<wbr>iterations</code>"]
