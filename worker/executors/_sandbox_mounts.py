"""What of a CLI's installation its sandbox mounts: the package, the interpreter, their libraries.

Never the prefix of the directory the CLI was found in: a CLI in a virtualenv, in
``~/.local/bin`` or in a work directory next to other files would expose all of it.

- the executable, symlinks resolved; if it lies in a ``node_modules`` tree, its package
  directory (``node_modules/<name>`` or ``node_modules/@scope/<name>``), else the file alone;
- a script's interpreter (its ``#!`` line, ``env`` looked up on PATH): the binary, and for
  Python the directories its ``sys.path`` holds plus a virtualenv's ``pyvenv.cfg``;
- the shared libraries ``ldd`` lists for the executable and the interpreter.

Paths under the system directories the sandbox mounts whole are left out; ``/usr/local``
is not one of them (the sandbox hides it, so what a CLI needs there is mounted alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Directories the sandbox mounts whole (read-only), and the one it hides under them.
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
HIDDEN_ROOTS = ("/usr/local",)
_PROBE_TIMEOUT_S = 10.0
_SHEBANG_BYTES = 256


@dataclass(frozen=True, slots=True)
class InstallMounts:
    """The CLI as the sandbox runs it (symlinks resolved) and what it mounts for it."""

    executable: str
    paths: tuple[str, ...]


@lru_cache(maxsize=16)
def install_mounts(executable: str) -> InstallMounts:
    """What the sandbox mounts read-only for ``executable`` (a CLI or the helper's python)."""
    resolved = os.path.realpath(executable)
    paths = [package_directory(resolved)]
    binaries = [resolved]
    if "python" in Path(resolved).name:  # the helper's interpreter: its standard library
        paths += python_paths(executable, site=False)
    interpreter = script_interpreter(resolved)
    if interpreter is not None:
        # As the script names it (a virtualenv's python finds its pyvenv.cfg from there)
        # and resolved (the binary that runs).
        binaries.append(os.path.realpath(interpreter))
        paths += [interpreter, binaries[-1]]
        if "python" in Path(interpreter).name:
            paths += python_paths(interpreter)
    for binary in binaries:
        paths += shared_libraries(binary)
    kept = [path for path in dict.fromkeys(paths) if not mounted_whole(path)]
    return InstallMounts(executable=resolved, paths=tuple(_outermost(kept)))


def package_directory(resolved: str) -> str:
    """The npm package holding ``resolved``, or the file itself."""
    parts = Path(resolved).parts
    if "node_modules" in parts:
        last = len(parts) - 1 - parts[::-1].index("node_modules")
        name_parts = 2 if parts[last + 1 : last + 2] and parts[last + 1].startswith("@") else 1
        return str(Path(*parts[: last + 1 + name_parts]))
    return resolved


def script_interpreter(resolved: str) -> str | None:
    """The interpreter a ``#!`` script names (``/usr/bin/env node``: node on PATH)."""
    try:
        with open(resolved, "rb") as file:
            head = file.read(_SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    program = words[0]
    if Path(program).name == "env":
        names = [word for word in words[1:] if not word.startswith("-")]
        found = shutil.which(names[0]) if names else None
        program = found or ""
    return program if program and os.path.exists(program) else None


def python_paths(interpreter: str, *, site: bool = True) -> list[str]:
    """What a Python interpreter imports from: its ``sys.path`` directories (without
    ``site``: its standard library only), and a virtualenv's ``pyvenv.cfg`` (without it,
    it would not find its site-packages)."""
    code = "import json, sys; print(json.dumps([sys.prefix, [p for p in sys.path if p]]))"
    try:
        completed = subprocess.run(
            [interpreter, "-I", *([] if site else ["-S"]), "-c", code],
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
            env={"PATH": os.defpath},
        )
        prefix, entries = json.loads(completed.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    paths = [entry for entry in entries if os.path.exists(entry)]
    config = Path(prefix) / "pyvenv.cfg"
    return [*paths, str(config)] if config.exists() else paths


def shared_libraries(binary: str) -> list[str]:
    """The libraries ``ldd`` resolves for ``binary`` (none for a script or a static binary)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        completed = subprocess.run(
            [ldd, binary], capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    libraries = []
    for line in completed.stdout.decode("utf-8", "replace").splitlines():
        _, arrow, target = line.partition("=>")
        path = (target if arrow else line).strip().split(" (", 1)[0].strip()
        if path.startswith("/") and os.path.exists(path):
            libraries.append(os.path.realpath(path))
    return libraries


def mounted_whole(path: str) -> bool:
    """True when the sandbox's system mounts already hold ``path``."""
    return _under(path, SYSTEM_ROOTS) and not _under(path, HIDDEN_ROOTS)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without those inside another one of them."""
    return [path for path in paths if not any(path.startswith(other + "/") for other in paths)]
