"""MkDocs hook (mkdocs.yml ``hooks``): each ``<!-- reference: NAME -->`` becomes its table.

Written from the code at every build (``worker.dev.docs.render``), so the reference pages
hold no committed copy that could go stale. An unknown name fails the build.
"""

from __future__ import annotations

import re

from worker.dev.docs import render

MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    return MARKER.sub(lambda match: render(match.group(1)), markdown)
