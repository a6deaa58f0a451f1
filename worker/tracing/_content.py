"""Prompts, completions, tool arguments and results in spans: off unless the operator opts in.

``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is the standard switch: ``true``,
``SPAN_ONLY`` or ``SPAN_AND_EVENT`` capture content on spans (this worker emits no GenAI
events); unset, ``false``, ``NO_CONTENT`` or ``EVENT_ONLY`` capture none. Every captured
text passes the process's redactor (the secrets it knows and the shapes of common
credentials) and is then cut to ``CONTENT_MAX_CHARS``; the SDK's
``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` still bounds each attribute as a whole.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from worker import logs
from worker.redaction import Redactor, process_redactor

CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURING = frozenset({"true", "span_only", "span_and_event"})
_NOT_CAPTURING = frozenset({"", "false", "no_content", "event_only"})
CONTENT_MAX_CHARS = 4_000
TRUNCATED_MARK = "…[truncated]"


@lru_cache(maxsize=1)
def capture_content() -> bool:
    """Whether spans carry message content (read once per process)."""
    value = os.environ.get(CAPTURE_VARIABLE, "").strip().lower()
    if value in _CAPTURING:
        return True
    if value not in _NOT_CAPTURING:
        logs.log_event(
            "trace_content_setting_ignored",
            "warning",
            variable=CAPTURE_VARIABLE,
            value=value,
            detail="expected true, false, NO_CONTENT, SPAN_ONLY, EVENT_ONLY or SPAN_AND_EVENT; "
            "no content is captured",
        )
    return False


@lru_cache(maxsize=1)
def _environment_redactor() -> Redactor:
    return process_redactor()


def safe_text(text: str) -> str:
    """A text fit for a span: redacted (the log redactor, then the environment's secrets
    and credential shapes), then capped. Redacted first, so a cut never halves a secret."""
    cleaned = _environment_redactor()(logs.redact(text))
    if len(cleaned) <= CONTENT_MAX_CHARS:
        return cleaned
    return cleaned[: CONTENT_MAX_CHARS - len(TRUNCATED_MARK)] + TRUNCATED_MARK


def as_json(value: Any) -> str:
    """Structured content as the JSON string the conventions allow on spans."""
    return json.dumps(value, ensure_ascii=False, default=str)
