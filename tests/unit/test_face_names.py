"""A package face exports only what something outside its package uses.

A name that only tests (or benches) import stays in its private module and the tests
import it from there (``from worker.models._scripted import ScriptedModel``): the face
is what the rest of the worker, the MCP servers and users rely on. Users' names are
listed in ``FOR_USERS`` with where the docs or packaging name them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("worker", "hub_client", "mcp_servers")

FOR_USERS = {
    "worker.AgentWorker",  # RQ_WORKER_CLASS=worker.AgentWorker (README.md, deploy/)
    "worker.enqueue_task",  # docs/how-to/enqueue.md
    "worker.EnqueueResult",  # what enqueue_task returns
    "worker.operations.main",  # the agent-worker entry point (pyproject.toml)
    "worker.dev.scripted_endpoint.ScriptedEndpoint",  # the face's docstring, in process
}


def _faces() -> dict[str, set[str]]:
    """Face -> the names it re-exports (``from module import Name as Name``)."""
    faces: dict[str, set[str]] = {}
    for init in sorted((ROOT / "worker").rglob("__init__.py")):
        face = ".".join(init.relative_to(ROOT).parent.parts)
        faces[face] = {
            alias.name
            for node in ast.walk(ast.parse(init.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            for alias in node.names
            if alias.asname == alias.name
        }
    return faces


def _used_outside(face: str, sources: dict[str, tuple[str, ast.Module]]) -> set[str]:
    """The face's names that a module outside the face's package imports or reads."""
    package = face.replace(".", "/") + "/"
    attribute = re.compile(rf"\b{re.escape(face.rpartition('.')[2])}\.(\w+)")
    used: set[str] = set()
    for path, (text, tree) in sources.items():
        if path.startswith(package):
            continue
        used |= {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == face
            for alias in node.names
        }
        used |= set(attribute.findall(text))
    return used


def test_every_face_name_has_a_user_outside_its_package() -> None:
    sources = {
        str(path.relative_to(ROOT)): (path.read_text(), ast.parse(path.read_text()))
        for tree in RUNTIME
        for path in (ROOT / tree).rglob("*.py")
    }
    faces = _faces()
    exported = {f"{face}.{name}" for face, names in faces.items() for name in names}
    assert exported >= FOR_USERS, "a name for users left its face: update FOR_USERS"
    only_tests = sorted(
        f"{face}.{name}"
        for face, names in faces.items()
        for name in names - _used_outside(face, sources)
        if f"{face}.{name}" not in FOR_USERS
    )
    assert only_tests == []
