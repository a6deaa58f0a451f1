"""The import graph runs one way: each module imports only its own layer and those below.

The order is written once, in ``LAYERS`` (docs/development.md draws it). Every import
counts, whether at module level, under ``TYPE_CHECKING`` or inside a function: a
function-level import is still a dependency a reader has to follow. Two more rules:
a module never reaches into another package's private module (``worker.daemon._host``
from ``worker.operations``), and no import cycle exists between modules, each package face
(``__init__``) counted as a module of its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ("worker", "hub_client", "mcp_servers")

# Lowest first. A module's layer is that of the longest prefix listed here; a module may
# import from its own layer and any layer below. Packages of one layer may import each
# other, as long as no cycle forms (the cycle check below holds that).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Stand apart: the Hub's client and the rules it shares with the worker.
    ("hub client", ("hub_client",)),
    (
        "base",
        (
            "worker._version",
            "worker._hooks",
            "worker._network",
            "worker._signals",
            "worker._spawn",
            "worker._task_groups",
            "worker._process_loop",
            "worker._tokens",
            "worker.settings",
            "worker.exceptions",
            "worker.task",
            "worker.logs",
            "worker.redaction",
            "worker._lazy",
            "mcp_servers._html",
            "mcp_servers._ssrf",
        ),
    ),
    (
        "plumbing",
        (
            "worker.redis_io",
            "worker.agents",
            "worker.models",
            "worker.tools",
            "worker.tracing",
            "mcp_servers._identity",
            "mcp_servers._tracing",
            "mcp_servers._serving",
        ),
    ),
    ("loop", ("worker.loop",)),
    (
        "shared state",
        ("worker.coordination", "worker.memory", "worker.hub_writes", "worker.metrics"),
    ),
    # The MCP servers the worker starts beside a task; the gateway re-hosts the worker's
    # toolbox stack for a CLI, so it sits with the executors that launch it.
    (
        "task",
        (
            "worker.pipeline",
            "worker.executors",
            "mcp_servers.gateway",
            "mcp_servers._gateway_inputs",
            "mcp_servers._gateway_socket",
            "mcp_servers.hub",
            "mcp_servers.web",
            "mcp_servers.memory",
        ),
    ),
    (
        "process",
        (
            "worker.daemon",
            "worker.jobs",
            "worker.rq_config",
            "worker.enqueue",
            "worker.operations",
        ),
    ),
    ("faces", ("worker", "mcp_servers")),
    ("dev aids", ("worker.dev",)),
)

# Tighter than the order: what these may import, beyond the standard library and
# third-party packages (a prefix, or a whole layer by its name). The Hub client imports
# nothing of the worker; the Hub and web servers only the two lowest layers; the memory
# server those and memory (``test_import_faces`` checks it loads no loop nor models).
ONLY_FROM: Mapping[str, tuple[str, ...]] = {
    "hub_client": ("hub_client",),
    "mcp_servers.hub": ("hub_client", "mcp_servers._", "base", "plumbing"),
    "mcp_servers.web": ("hub_client", "mcp_servers._", "base", "plumbing"),
    "mcp_servers.memory": ("mcp_servers._", "worker.memory", "base", "plumbing"),
}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    path: Path
    line: int


def _layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...]) -> int | None:
    best: tuple[int, int] | None = None
    for rank, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix))
    return None if best is None else best[0]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(root: Path, trees: tuple[str, ...] = TREES) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            found[_module_name(root, path)] = path
    return found


def imports_of(root: Path, modules: Mapping[str, Path]) -> Iterator[Import]:
    """Every import between the modules, at any level of the file."""
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        yield Import(source, alias.name, path, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join([*base, node.module] if node.module else base)
                else:
                    origin = node.module or ""
                for alias in node.names:
                    submodule = f"{origin}.{alias.name}"
                    target = submodule if submodule in modules else origin
                    if target in modules:
                        yield Import(source, target, path, node.lineno)


def _private_reach(source: str, target: str) -> bool:
    """``target`` is a private module of a package ``source`` is not inside."""
    parts = target.split(".")
    # ``worker``'s own base modules (``worker._version``) serve the MCP servers shipped beside.
    for depth, part in enumerate(parts):
        if part.startswith("_") and depth > (1 if parts[0] == "worker" else 0):
            owner = ".".join(parts[:depth])
            return not (source == owner or source.startswith(owner + "."))
    return False


def _allowed_by(
    prefixes: tuple[str, ...], target: str, layers: tuple[tuple[str, tuple[str, ...]], ...]
) -> bool:
    names = [name for name, _ in layers]
    for prefix in prefixes:
        if prefix in names:
            if _layer_of(target, layers) == names.index(prefix):
                return True
        elif target == prefix or target.startswith(
            prefix if prefix.endswith("_") else prefix + "."
        ):
            return True
    return False


def layer_violations(
    edges: list[Import],
    layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS,
    only_from: Mapping[str, tuple[str, ...]] = ONLY_FROM,
) -> list[str]:
    problems: list[str] = []
    names = [name for name, _ in layers]
    for edge in edges:
        where = f"{edge.path.relative_to(ROOT) if edge.path.is_relative_to(ROOT) else edge.path}"
        where += f":{edge.line}"
        source_rank = _layer_of(edge.source, layers)
        target_rank = _layer_of(edge.target, layers)
        if source_rank is None or target_rank is None:
            missing = edge.source if source_rank is None else edge.target
            problems.append(f"{where}: {missing} has no layer in LAYERS")
            continue
        if target_rank > source_rank:
            problems.append(
                f"{where}: {edge.source} ({names[source_rank]}) imports {edge.target}"
                f" ({names[target_rank]}), a layer above it"
            )
        if _private_reach(edge.source, edge.target):
            problems.append(
                f"{where}: {edge.source} reaches into {edge.target}, private to another package"
            )
        for holder, allowed in only_from.items():
            inside = edge.source == holder or edge.source.startswith(holder + ".")
            outside = inside and not edge.target.startswith(holder)
            if outside and not _allowed_by(allowed, edge.target, layers):
                problems.append(f"{where}: {edge.source} imports {edge.target}, outside {allowed}")
    return problems


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
            graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _edges() -> list[Import]:
    return list(imports_of(ROOT, modules_under(ROOT)))


def test_every_import_runs_down_the_layers() -> None:
    problems = layer_violations(_edges())
    assert problems == [], "\n".join(problems)


def test_no_import_cycle_between_modules() -> None:
    found = cycles(_edges())
    assert found == [], "\n".join(" -> ".join(component) for component in found)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> list[Import]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(imports_of(tmp_path, modules_under(tmp_path, ("worker",))))


def test_the_check_names_an_upward_import_a_private_reach_and_a_cycle(tmp_path: Path) -> None:
    edges = _tree(
        tmp_path,
        {
            "worker/__init__.py": "",
            "worker/settings.py": "def f():\n    from worker.loop import AgentLoop\n",
            "worker/loop/__init__.py": "from worker.loop._run import AgentLoop\n",
            "worker/loop/_run.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from worker.loop import AgentLoop\n",
            "worker/daemon/__init__.py": "",
            "worker/daemon/_host.py": "",
            "worker/operations/__init__.py": "from worker.daemon import _host\n",
        },
    )
    problems = layer_violations(edges)
    assert any(
        "worker/settings.py:2: worker.settings (base) imports worker.loop (loop)" in problem
        for problem in problems
    ), problems
    assert any("worker.operations reaches into worker.daemon._host" in p for p in problems), (
        problems
    )
    assert cycles(edges) == [["worker.loop", "worker.loop._run"]]


@pytest.mark.parametrize("module", ["worker.nowhere_yet", "mcp_servers.new_server"])
def test_a_module_without_a_layer_is_named(tmp_path: Path, module: str) -> None:
    edge = Import("worker.settings", module, tmp_path / "worker/settings.py", 3)
    layers = tuple(
        (name, tuple(p for p in prefixes if p not in {"worker", "mcp_servers"}))
        for name, prefixes in LAYERS
    )
    assert layer_violations([edge], layers) == [
        f"{tmp_path / 'worker/settings.py'}:3: {module} has no layer in LAYERS"
    ]
