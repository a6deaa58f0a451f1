"""Markdown table cells from code text: one line each, pipes escaped."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence


def cell(text: str) -> str:
    """One table cell: the text's lines joined, ``|`` escaped (also inside code spans)."""
    return " ".join(text.split()).replace("|", "\\|")


def code(text: str) -> str:
    return f"`{text}`" if text else ""


def breakable_name(name: str) -> str:
    """A key as code that may break after a ``.`` or ``_`` and nowhere else: the stylesheet
    keeps words in tables whole, and ``behavior.notifications.respond_to_thread_updates``
    whole would push the meaning column off the page."""
    return "<code>" + re.sub(r"([._])", r"\1<wbr>", html.escape(name)) + "</code>"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(cell(value) for value in row) + " |" for row in rows)
    return "\n".join(lines) + "\n"
