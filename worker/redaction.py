"""Masking of secrets in anything that leaves the process: logs, reports, posts, rq errors.

Two nets: the exact values of every secret this process knows (settings, and
environment variables whose names say KEY, TOKEN, SECRET or PASSWORD), and the
shapes of common credentials, for secrets it was never told about.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

MASK = "[REDACTED]"
# Values shorter than this are too likely to collide with ordinary words.
_MIN_SECRET_LENGTH = 8
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
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://[^\s:/@]+:)[^\s@/]+(?=@)", re.I)
_BEARER = re.compile(r"(?P<prefix>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=\-]{8,}", re.I)


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted(
            {s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True
        )
        self._known = re.compile("|".join(re.escape(v) for v in values)) if values else None

    def __call__(self, text: str) -> str:
        return self.redact(text)

    def redact(self, text: str) -> str:
        if not text:
            return text
        if self._known is not None:
            text = self._known.sub(MASK, text)
        text = _SECRET_SHAPES.sub(MASK, text)
        text = _URL_PASSWORD.sub(lambda m: m.group("scheme") + MASK, text)
        return _BEARER.sub(lambda m: m.group("prefix") + MASK, text)


def secrets_from_environment(environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return [value for name, value in env.items() if _SECRET_NAME.search(name) and value]


def process_redactor(extra: Iterable[str] = ()) -> Redactor:
    """The redactor for this process: environment secrets plus ``extra`` known values."""
    return Redactor([*secrets_from_environment(), *extra])
