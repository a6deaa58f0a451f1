"""The site's strict build fails on what a newcomer trips over (mkdocs.yml, `make docs-build`).

A copy of docs/ with an orphaned page, a link to a missing page and one to a missing anchor,
built with the repository's own mkdocs.yml, must fail naming all three. (``--quiet`` would
hide the warnings ``--strict`` counts and let the build pass: the Makefile never uses it.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build(tmp_path: Path, docs: Path) -> subprocess.CompletedProcess[str]:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("site_dir: .venv/site", f"site_dir: {tmp_path / 'site'}")
    config = config.replace(
        "  - worker/dev/docs/hooks.py", f"  - {REPO / 'worker/dev/docs/hooks.py'}"
    )
    (tmp_path / "mkdocs.yml").write_text(config, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-f", str(tmp_path / "mkdocs.yml")],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )


def test_the_strict_build_fails_on_an_orphaned_page_a_missing_page_and_a_missing_anchor(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "orphan.md").write_text("# A page nobody listed\n", encoding="utf-8")
    with (docs / "index.md").open("a", encoding="utf-8") as index:
        index.write("\n[gone](no-such-page.md) [moved](concepts/outcomes.md#no-such-anchor)\n")
    built = build(tmp_path, docs)
    said = built.stdout + built.stderr
    assert built.returncode != 0
    assert "orphan.md" in said and 'not included in the "nav"' in said
    assert "no-such-page.md" in said and "no-such-anchor" in said
