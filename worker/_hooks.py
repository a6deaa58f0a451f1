"""Operator hooks: Python callables named by an import path in a setting.

``CAN_EXECUTE_TOOL=package.module:function`` names a check asked before every
tool call, in the native loop and in the gateway that serves CLI executors:
``function(tool_name, arguments)`` returns None (or True) to let the call run,
or a string (the reason the model reads) to refuse it; it may be async. A check
that raises refuses the call.

A hook is imported once per process (the worker parent, at start, so every
forked job inherits it); a bad path fails at start with a message naming the
variable.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

_IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][\w.]*$")


def allow_every_tool(tool_name: str, arguments: dict[str, Any]) -> None:
    """The ``CAN_EXECUTE_TOOL`` check where the operator set none: every call runs."""


def load_can_execute_tool(import_path: str) -> Callable[..., Any]:
    """The ``CAN_EXECUTE_TOOL`` check; ValueError says what is wrong with the path."""
    hook = load_hook(import_path)
    _check_signature(import_path, hook, ("tool_name", "arguments"))
    return hook


@functools.cache
def load_hook(import_path: str) -> Callable[..., Any]:
    """The callable at ``module:attribute``, imported once per process; ValueError says
    what is wrong with the path."""
    if not _IMPORT_PATH.match(import_path):
        raise ValueError(
            f"must be an import path like package.module:function, got {import_path!r}"
        )
    module_name, _, attribute_path = import_path.partition(":")
    try:
        target: Any = _import(module_name)
    except Exception as exc:
        raise ValueError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for attribute in attribute_path.split("."):
        try:
            target = getattr(target, attribute)
        except AttributeError:
            raise ValueError(
                f"module {module_name!r} has no attribute {attribute_path!r}"
            ) from None
    if not callable(target):
        raise ValueError(f"{import_path} is not callable")
    return target  # type: ignore[no-any-return]


def _import(module_name: str) -> Any:
    """The module, also from the working directory: ``rq worker`` puts it on sys.path, the
    ``agent-worker`` commands do not, and a hook must load the same way in both."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError:
        cwd = os.getcwd()
        if cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)


def _check_signature(
    import_path: str, hook: Callable[..., Any], arguments: tuple[str, ...]
) -> None:
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        signature.bind(*arguments)
    except TypeError:
        raise ValueError(
            f"{import_path} must accept ({', '.join(arguments)}), its signature is {signature}"
        ) from None
