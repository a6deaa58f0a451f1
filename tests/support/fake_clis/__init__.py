"""Fake coding-agent CLIs for the executor tests: the real flags only, the real output shapes.

``install_fake_cli("claude", directory)`` writes an executable ``directory/claude``
whose shebang is this interpreter. Each fake accepts only its CLI's real flags (from
the installed CLI's ``--help`` or its documentation) and exits 1 on any other, so a
wrong flag fails the test. It reads what to do from ``<name>.scenario.json`` next to
it, records what it was given (argv, environment, stdin, the files its flags name,
the gateway's tools) in ``<name>.record.json``, and prints that CLI's output.

The executor gives a CLI a minimal environment, so the fakes find their scenario by
their own location, never through an environment variable.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
FAKE_CLIS = ("claude", "opencode", "aider", "goose")


def install_fake_cli(name: str, directory: Path, scenario: dict[str, Any] | None = None) -> Path:
    """Write the fake ``name`` into ``directory`` (and its scenario); return its path."""
    if name not in FAKE_CLIS:
        raise ValueError(f"no fake for {name!r}")
    path = directory / name
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        f"from tests.support.fake_clis.{name} import main\n"
        "sys.exit(main())\n",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    set_scenario(path, scenario or {})
    return path


def set_scenario(fake: Path, scenario: dict[str, Any]) -> None:
    fake.with_name(f"{fake.name}.scenario.json").write_text(json.dumps(scenario))


def read_record(fake: Path) -> dict[str, Any]:
    """What the fake was last run with; KeyError-free: an empty dict if it never ran."""
    path = fake.with_name(f"{fake.name}.record.json")
    if not path.exists():
        return {}
    record: dict[str, Any] = json.loads(path.read_text())
    return record
