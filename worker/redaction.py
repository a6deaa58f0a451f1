"""Masking of secrets in anything that leaves the process: model requests, logs, reports,
posts, rq errors.

Two nets: the values of every secret this process knows (settings, and environment
variables whose names say KEY, TOKEN, SECRET or PASSWORD), and the shapes of common
credentials, for secrets it was never told about.

A known value is also caught when it is spelled out with separators between its
characters ("s k - a n t …", "S.K.A.N.T…") and in any letter case: a model that
is talked into leaking a key spells it out to get past an exact match. Only the
letters and digits of the value are matched, with up to ``SEPARATOR_RUN``
characters that are neither (spaces, punctuation, ``_``, zero-width characters)
between two of them, and more where the value has punctuation; also when written in
full-width or other compatibility characters (NFKC). The two classes never overlap
and the separators are possessive, so a match is one pass over the text with no
backtracking.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable, Sequence

MASK = "[REDACTED]"
# Values shorter than this are too likely to collide with ordinary words.
_MIN_SECRET_LENGTH = 8
# Separator characters tolerated between two characters of a known value.
SEPARATOR_RUN = 3
_VALUE_CHAR = re.compile(r"[^\s\W_]")
# Whole words of a variable name: MCP_AUTH_TOKEN is a secret, LLM_TOKENS_PER_MINUTE is not.
_SECRET_NAME = re.compile(
    r"(?<![A-Z])(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?![A-Z])", re.IGNORECASE
)

_SECRET_SHAPES = re.compile(
    "|".join(
        [
            r"sk-ant-[A-Za-z0-9_\-]{10,}",  # Anthropic
            r"sk-(?:proj-|live-|test-)?[A-Za-z0-9_\-]{16,}",  # OpenAI and look-alikes
            r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
            r"github_pat_[A-Za-z0-9_]{20,}",
            r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
            r"AKIA[0-9A-Z]{16}",  # AWS access key id
            r"AIza[0-9A-Za-z_\-]{35}",  # Google API key
            r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",  # JWT
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
        ]
    )
)
# Credentials inside URLs (postgres://user:pass@host) and bearer headers.
# Both start with a cheap test (a scheme starts where no scheme character precedes it).
_URL_PASSWORD = re.compile(
    r"(?<![a-z0-9+.\-])(?P<scheme>[a-z][a-z0-9+.\-]*://[^\s:/@]+:)[^\s@/]+(?=@)", re.I
)
_BEARER = re.compile(
    r"(?=[bt])(?P<prefix>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=\-]{8,}", re.I
)
_BEARER_WORDS = ("bearer", "basic", "token")


def known_value_pattern(secret: str) -> str:
    """The pattern of one known value: its letters and digits, separators allowed between.

    A value with too few letters and digits to be told from ordinary text is matched
    exactly. Letters are written as ``[aA]`` classes rather than with IGNORECASE,
    which sre matches about twice as fast.
    """
    characters = _VALUE_CHAR.findall(secret)
    if len(characters) < _MIN_SECRET_LENGTH:
        return "".join(_either_case(character) for character in secret)
    parts: list[str] = []
    # Where the value has its own punctuation ("-" in "hub-key"), each of those characters
    # may come with separators of its own around it.
    gap = 0
    for character in secret:
        if not _VALUE_CHAR.match(character):
            gap += 1
            continue
        if parts:
            most = SEPARATOR_RUN + gap * (SEPARATOR_RUN + 1)
            parts.append(rf"[\s\W_]{{0,{most}}}+")
        parts.append(_either_case(character))
        gap = 0
    return "".join(parts)


def _known_values(values: Sequence[str]) -> re.Pattern[str] | None:
    if not values:
        return None
    # The lookahead on the possible first characters lets most positions fail at once.
    first = sorted({c for v in values for c in _first_characters(v)})
    branches = "|".join(known_value_pattern(v) for v in values)
    return re.compile(f"(?=[{re.escape(''.join(first))}])(?:{branches})")


def _first_characters(value: str) -> tuple[str, str]:
    characters = _VALUE_CHAR.findall(value)
    start = characters[0] if len(characters) >= _MIN_SECRET_LENGTH else value[0]
    return start.lower(), start.upper()


def _either_case(character: str) -> str:
    lower, upper = character.lower(), character.upper()
    if lower == upper or len(lower) != 1 or len(upper) != 1:
        return re.escape(character)
    return f"[{re.escape(lower)}{re.escape(upper)}]"


class Redactor:
    """Masks known secret values (also spelled out) and secret-shaped strings in text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted(
            {s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True
        )
        self._known = _known_values(values)

    def __call__(self, text: str) -> str:
        return self.redact(text)

    def redact(self, text: str) -> str:
        if not text:
            return text
        if self._known is not None:
            text = self._known.sub(MASK, self._folded(text, self._known))
        text = _SECRET_SHAPES.sub(MASK, text)
        if "://" in text:
            text = _URL_PASSWORD.sub(lambda m: m.group("scheme") + MASK, text)
        lowered = text.lower()
        if any(word in lowered for word in _BEARER_WORDS):
            text = _BEARER.sub(lambda m: m.group("prefix") + MASK, text)
        return text

    @staticmethod
    def _folded(text: str, known: re.Pattern[str]) -> str:
        """``text``, NFKC-folded when only that shows a known value (full-width letters,
        ligatures, mathematical alphanumerics spelling it); otherwise as it was."""
        if text.isascii():
            return text
        folded = unicodedata.normalize("NFKC", text)
        if folded != text and known.search(folded) and not known.search(text):
            return folded
        return text


def secrets_from_environment(environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return [value for name, value in env.items() if _SECRET_NAME.search(name) and value]


def process_redactor(extra: Iterable[str] = ()) -> Redactor:
    """The redactor for this process: environment secrets plus ``extra`` known values."""
    return Redactor([*secrets_from_environment(), *extra])
