"""The site's strict build fails on what a newcomer trips over (mkdocs.yml, `make docs-build`).

A copy of docs/ with an orphaned page, a link to a missing page and one to a missing anchor,
built with the repository's own mkdocs.yml, must fail naming all three. (``--quiet`` would
hide the warnings ``--strict`` counts and let the build pass: the Makefile never uses it.)
The sidebar says what each page's heading says, and no code line is wider than the column
the site shows beside both sidebars.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# Characters of a code line that the site shows without scrolling at a 1280-pixel-wide window
# (docs/stylesheets/extra.css sets the code font and the page width).
CODE_COLUMNS = 88
FENCE = re.compile(r"^\s*```")


def nav_pages(items: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for item in items:
        for title, target in item.items():
            if isinstance(target, list):
                yield from nav_pages(target)
            else:
                yield title, target


def first_heading(page: Path) -> str:
    heading = next(
        line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("# ")
    )
    return heading.removeprefix("# ").replace("`", "")


def test_every_sidebar_title_is_its_pages_first_heading() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    nav = yaml.safe_load(config[config.index("\nnav:\n") :])["nav"]
    differ = [
        (title, page, first_heading(DOCS / page))
        for title, page in nav_pages(nav)
        if page != "index.md" and title != first_heading(DOCS / page)
    ]
    assert differ == []


def test_no_code_line_is_wider_than_the_column_the_site_shows() -> None:
    wide = []
    for page in sorted(DOCS.rglob("*.md")):
        inside = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line):
                inside = not inside
            elif inside and len(line) > CODE_COLUMNS:
                wide.append(f"{page.relative_to(DOCS)}:{number}: {len(line)} characters")
    assert wide == []


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
