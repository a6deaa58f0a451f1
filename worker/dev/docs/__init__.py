"""The documentation's reference tables, written from the code as the site builds.

    page                          marker                            from
    docs/reference/settings.md    <!-- reference: settings -->      worker.settings.Settings
    docs/reference/definition.md  <!-- reference: definition -->    `agent-worker schema`
    docs/reference/cli.md         <!-- reference: commands -->      the `agent-worker` parsers
    docs/reference/metrics.md     <!-- reference: metrics -->       worker.metrics' families
    docs/concepts/outcomes.md     <!-- reference: outcomes -->      worker.task.Outcome

``hooks.py`` (named in mkdocs.yml) replaces each marker with ``render(name)``, so no
generated page is committed and none can drift from the code. ``undocumented()`` names
every setting, key, flag, metric or outcome that has no description: a test keeps it empty.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.dev.docs._commands import command_table, undocumented_flags
from worker.dev.docs._definition import definition_table, undocumented_keys
from worker.dev.docs._metrics import metric_table, undocumented_metrics
from worker.dev.docs._outcomes import outcome_table, undocumented_outcomes
from worker.dev.docs._settings import settings_table, undocumented_settings

REFERENCES: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "definition": definition_table,
    "commands": command_table,
    "metrics": metric_table,
    "outcomes": outcome_table,
}


def render(name: str) -> str:
    """The markdown of one reference; an unknown name raises, so a typo fails the build."""
    try:
        return REFERENCES[name]()
    except KeyError:
        known = ", ".join(sorted(REFERENCES))
        raise ValueError(f"no reference named {name!r} (known: {known})") from None


def undocumented() -> list[str]:
    """Everything the reference would print without a meaning, as ``kind: name``."""
    return [
        *(f"setting: {name}" for name in undocumented_settings()),
        *(f"definition key: {name}" for name in undocumented_keys()),
        *(f"flag: {name}" for name in undocumented_flags()),
        *(f"metric: {name}" for name in undocumented_metrics()),
        *(f"outcome: {name}" for name in undocumented_outcomes()),
    ]
