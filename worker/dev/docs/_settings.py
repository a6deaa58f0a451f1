"""Every setting: its variable, default and meaning, from ``Settings``' fields."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from worker.dev.docs._markdown import code, table
from worker.settings import Settings


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None or field.default in (None, ""):
        return "—"
    value = field.default
    if isinstance(value, SecretStr):
        return "—"
    if isinstance(value, bool):
        return code(str(value).lower())
    return code(str(value))


def settings_table() -> str:
    rows = [
        (code(name.upper()), _default(field), field.description or "")
        for name, field in Settings.model_fields.items()
    ]
    return table(("variable", "default", "meaning"), rows)


def undocumented_settings() -> list[str]:
    return [
        name.upper()
        for name, field in Settings.model_fields.items()
        if not (field.description or "").strip()
    ]
