"""HTML to readable text, at a bounded CPU cost.

``html.parser`` is quadratic on some inputs (400 KB of ``</`` took 12 s), and a
parse holds the GIL. So ``readable_html`` parses at most ``MAX_PARSE_CHARS`` in a
separate process (``anyio.to_process``), never on the server's event loop, and
kills that process when the parse outlives its time; the page then comes back
with its tags stripped by a linear pass instead.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser

import anyio
import anyio.to_process

MAX_PARSE_CHARS = 500_000
PARSE_TIMEOUT_S = 5.0
# Starting a parse process (a new interpreter) is slow on a loaded host; it is not the parse.
PROCESS_START_TIMEOUT_S = 60.0
# A tag for the rough fallback: bounded, so a lone "<" costs one short scan.
_ROUGH_TAG = re.compile(r"<[^<>]{0,2000}>")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadableHtml:
    title: str
    text: str
    # Why the text may be incomplete or rough; None when the whole page was parsed.
    note: str | None = None


async def readable_html(markup: str, *, timeout_s: float = PARSE_TIMEOUT_S) -> ReadableHtml:
    """Title and text of ``markup``, parsed in a worker process for at most ``timeout_s``."""
    notes = []
    if len(markup) > MAX_PARSE_CHARS:
        markup = markup[:MAX_PARSE_CHARS]
        notes.append(f"only the first {MAX_PARSE_CHARS} characters of the page were parsed")
    with anyio.move_on_after(PROCESS_START_TIMEOUT_S):
        # An idle parse process is ready afterwards (anyio keeps it for minutes), so the
        # parse's own time limit is not spent starting one.
        await anyio.to_process.run_sync(_ready, cancellable=True)
    with anyio.move_on_after(max(timeout_s, 0.0)):
        title, text = await anyio.to_process.run_sync(html_to_text, markup, cancellable=True)
        return ReadableHtml(title=title, text=text, note="; ".join(notes) or None)
    notes.append("the page's markup was too costly to parse, so its tags were stripped roughly")
    return ReadableHtml(title="", text=rough_text(markup), note="; ".join(notes))


def _ready() -> None:
    """Run in a parse process: returns once one is running."""


def rough_text(markup: str) -> str:
    """Text with tags removed in linear time: for pages the parser could not finish."""
    text = html.unescape(_ROUGH_TAG.sub(" ", markup))
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


# Content that is not text a reader would see.
_SKIPPED_TAGS = frozenset(
    {"script", "style", "noscript", "template", "svg", "iframe", "object", "canvas"}
)
# Tags that start a new line of text.
_BLOCK_TAGS = frozenset(
    {"address", "article", "aside", "blockquote", "br", "dd", "details", "div", "dl", "dt",
     "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
     "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "td", "th",
     "tr", "ul"}
)  # fmt: skip


class _ReadableText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.title_parts: list[str] = []
        self._line_parts: list[str] = []
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_TAGS:
            self._skip_depth += 1
        elif tag == "title":
            self._in_title = True
        elif tag in _BLOCK_TAGS:
            self.end_line()
            if tag == "li":
                self._line_parts.append("- ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED_TAGS:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag == "title":
            self._in_title = False
        elif tag in _BLOCK_TAGS:
            self.end_line()

    def handle_data(self, data: str) -> None:
        if self._skip_depth:
            return
        (self.title_parts if self._in_title else self._line_parts).append(data)

    def end_line(self) -> None:
        line = " ".join("".join(self._line_parts).split())
        if line and line != "-":
            self.lines.append(line)
        self._line_parts = []


def html_to_text(html: str) -> tuple[str, str]:
    """``(title, text)``: scripts, styles and tags dropped, one line per block, spaces collapsed."""
    parser = _ReadableText()
    parser.feed(html)
    parser.close()
    parser.end_line()
    title = " ".join("".join(parser.title_parts).split())
    return title, "\n".join(parser.lines)
