"""Size is a signal: a runtime module past 450 lines, or a function past 60, holds two
concerns (split it by concern, name the steps). Each test names every offender."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME_PACKAGES = ("worker", "hub_client", "mcp_servers")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def runtime_modules() -> list[Path]:
    return sorted(
        path for package in RUNTIME_PACKAGES for path in (REPO_ROOT / package).rglob("*.py")
    )


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines from ``def`` to the last line of its body) of every function."""
    return [
        (node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_the_runtime_tree_is_where_the_limits_look() -> None:
    modules = runtime_modules()
    assert len(modules) > 100
    assert REPO_ROOT / "worker" / "daemon" / "_concurrent.py" in modules


def test_no_runtime_module_is_over_450_lines() -> None:
    too_long = [
        f"{path.relative_to(REPO_ROOT)}: {lines} lines"
        for path in runtime_modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert too_long == [], f"over {MAX_MODULE_LINES} lines (split by concern): {too_long}"


def test_no_runtime_function_is_over_60_lines() -> None:
    too_long = [
        f"{path.relative_to(REPO_ROOT)}:{line} {name}: {length} lines"
        for path in runtime_modules()
        for name, line, length in function_lengths(path.read_text())
        if length > MAX_FUNCTION_LINES
    ]
    assert too_long == [], f"over {MAX_FUNCTION_LINES} lines (name its steps): {too_long}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    return 1\n", [("f", 1, 2)]),
        (
            "class C:\n    async def g(self):\n        x = 1\n\n        return x\n",
            [("g", 2, 4)],
        ),
    ],
)
def test_a_function_counts_from_its_def_to_its_last_line(
    source: str, expected: list[tuple[str, int, int]]
) -> None:
    assert function_lengths(source) == expected
