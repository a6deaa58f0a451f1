"""Keys of a config.yaml that no field reads: a typo (``behaviour:``) silently loses settings.

Each becomes a warning with its dotted path and, when one is close, the key that was
probably meant. Every key of the public Botburrow format is a field (``AgentConfig``),
also those the worker declines to act on (``capabilities.spawning``): they
never warn.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any, get_args, get_origin

from pydantic import BaseModel


def unknown_keys(document: Mapping[Any, Any], model: type[BaseModel]) -> list[str]:
    """One message per unknown key, in document order:
    ``unknown key 'behaviour' (did you mean 'behavior'?)``."""
    return list(_unknown_in(document, model, prefix=""))


def _unknown_in(document: Mapping[Any, Any], model: type[BaseModel], prefix: str) -> Iterator[str]:
    known = list(model.model_fields)
    for raw_key, value in document.items():
        key = str(raw_key)
        path = f"{prefix}{key}"
        if key in model.model_fields:
            yield from _unknown_below(value, model.model_fields[key].annotation, f"{path}.")
        else:
            yield _message(path, prefix, difflib.get_close_matches(key, known, n=1))


def _unknown_below(value: Any, annotation: Any, prefix: str) -> Iterator[str]:
    """Keys under a known field whose type is a section (or a list of sections)."""
    section = _section_model(annotation)
    if section is not None and isinstance(value, Mapping):
        yield from _unknown_in(value, section, prefix)
        return
    item_model = _list_item_model(annotation)
    if item_model is not None and isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, Mapping):
                yield from _unknown_in(item, item_model, f"{prefix}{index}.")


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds (``Brain``, ``Limits | None``); None for anything else."""
    if get_origin(annotation) is list:
        return None
    candidates = get_args(annotation) if get_origin(annotation) is not None else (annotation,)
    for candidate in candidates:
        if inspect.isclass(candidate) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) is not list:
        return None
    (item,) = get_args(annotation)
    return _section_model(item)


def _message(path: str, prefix: str, close: list[str]) -> str:
    if not close:
        return f"unknown key '{path}'"
    return f"unknown key '{path}' (did you mean '{prefix}{close[0]}'?)"


def shadowed_nested_switches(document: Mapping[Any, Any]) -> list[str]:
    """One message per switch set both in ``behavior`` and ``behavior.notifications``:
    the flat one is used."""
    behavior = document.get("behavior")
    if not isinstance(behavior, Mapping) or not isinstance(behavior.get("notifications"), Mapping):
        return []
    nested = behavior["notifications"]
    return [
        f"behavior.notifications.{switch} is ignored: behavior.{switch} is set too "
        "(the flat form wins)"
        for switch in nested
        if isinstance(switch, str)
        and behavior.get(switch) is not None
        and nested[switch] is not None
    ]
