"""Lazy package faces, each name written once: in the face's ``if TYPE_CHECKING:`` block.

A face that must stay light (``worker``, whose ``__init__`` runs before any of its
modules; ``worker.tools``, which the loop and the CLI gateway import without the MCP
client) writes each public name once, as an explicit re-export the type checker reads::

    if TYPE_CHECKING:
        from worker.tools._mcp import McpToolbox as McpToolbox

    __getattr__ = lazy_getattr(__name__)

``lazy_getattr`` reads that block from the face's own source (once, at import) to learn
where each name lives, imports the module on the name's first use, and sets the face's
``__all__`` to its eager and lazy names alike.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _reexports(body: list[ast.stmt]) -> dict[str, str]:
    """Name -> module of each ``from module import name as name`` in ``body``."""
    return {
        alias.name: node.module
        for node in body
        if isinstance(node, ast.ImportFrom) and node.module and not node.level
        for alias in node.names
        if alias.asname == alias.name
    }


def lazy_getattr(package: str) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` that imports each name of its
    ``TYPE_CHECKING`` block on first use."""
    face = sys.modules[package]
    tree = ast.parse(Path(str(face.__file__)).read_text())
    homes: dict[str, str] = {}
    declared: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            homes |= _reexports(node.body)
            declared += [
                stmt.target.id
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            ]
    eager = _reexports(tree.body)
    defined = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
    ]
    setattr(face, "__all__", sorted({*eager, *homes, *declared, *defined}))  # noqa: B010

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
