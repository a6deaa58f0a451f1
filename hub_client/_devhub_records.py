"""The devhub's records, the JSON file they are kept in, and how a request body is read.

A body field that is missing or of the wrong type raises ``DevHubProblem`` (422) with
the message the Hub would answer.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

JSONObject = dict[str, Any]


class DevHubProblem(Exception):
    """The answer is an error: ``status`` and a message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class DevHubStateError(Exception):
    """The state file cannot be read; the devhub refuses to start rather than lose it."""


@dataclass(kw_only=True)
class Records:
    posts: list[JSONObject] = field(default_factory=list)
    comments: list[JSONObject] = field(default_factory=list)
    consumption: list[JSONObject] = field(default_factory=list)
    notifications_read: list[str] = field(default_factory=list)
    activations: list[JSONObject] = field(default_factory=list)
    replays: int = 0
    agents: dict[str, JSONObject] = field(default_factory=dict)
    budgets: dict[str, JSONObject] = field(default_factory=dict)
    # Idempotency-Key -> {"request": "POST /path", "status": int, "body": answer}
    idempotency: dict[str, JSONObject] = field(default_factory=dict)
    last_ids: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StoredAnswer:
    status: int
    body: Any


def now_iso() -> str:
    return iso(datetime.now(UTC))


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def load_records(state_file: Path | None) -> Records:
    """The records saved in ``state_file``; empty ones without a file (or before the first
    write). Raises ``DevHubStateError`` rather than start over on a file it cannot read."""
    if state_file is None or not state_file.exists():
        return Records()
    try:
        saved = json.loads(state_file.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError) as e:
        raise DevHubStateError(f"cannot read state file {state_file}: {e}") from e
    if not isinstance(saved, dict):
        raise DevHubStateError(f"state file {state_file} does not hold a JSON object")
    known = {f.name for f in fields(Records)}
    return Records(**{key: value for key, value in saved.items() if key in known})


def save_records(state_file: Path, records: Records) -> None:
    # Write then rename, so a devhub killed mid-write never leaves half a file.
    temporary = state_file.with_name(state_file.name + ".tmp")
    temporary.write_text(json.dumps(asdict(records)), encoding="utf-8")
    os.replace(temporary, state_file)


def required_text(body: JSONObject, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DevHubProblem(422, f"{key} is required and must be a non-empty string")
    return value


def optional_text(body: JSONObject, key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DevHubProblem(422, f"{key} must be a string")
    return value


def required_count(body: JSONObject, key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DevHubProblem(422, f"{key} is required and must be a non-negative integer")
    return value


def required_amount(body: JSONObject, key: str) -> float:
    value = body.get(key)
    if not _is_amount(value):
        raise DevHubProblem(422, f"{key} is required and must be a non-negative number")
    return float(value)


def optional_flag(body: JSONObject, key: str, *, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise DevHubProblem(422, f"{key} must be true or false")
    return value


def optional_amount(body: JSONObject, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_amount(value):
        raise DevHubProblem(422, f"{key} must be a non-negative number")
    return float(value)


def _is_amount(value: object) -> TypeGuard[int | float]:
    # bool is an int to Python, never an amount to the Hub.
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
