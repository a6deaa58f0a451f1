"""The sandbox every coding-agent CLI runs in: bubblewrap, applied by the worker.

    host (worker)                                 sandbox (bwrap: own user, pid, net, ipc,
                                                  uts and mount namespaces; host uid
                                                  CLI_SANDBOX_UID when the worker is root)
    run dir (0711, root)
    ├── workspace/  ─────────── read-write ─────▶ the CLI's cwd and HOME
    ├── cli/        ─────────── read-only ──────▶ its prompt files, MCP config, this helper
    │   ├── gateway.sock ◀── mcp_servers.gateway ◀─ bridge (the CLI's only MCP server)
    │   └── model.sock   ◀── model forwarder    ◀─ relay on 127.0.0.1:<port> (its endpoint)
    └── gateway-calls.jsonl (host only)
    /usr, /lib…, a few /etc files, the CLI's install ─ read-only
    nothing else: a fresh /proc, /dev and /tmp; no home, no worker files, no network but lo

``sandbox_problem`` says what is missing on this host (``agent-worker check`` and
``agent-worker executors`` print it; a CLI task fails with it). ``CLI_SANDBOX=off``
runs CLIs unconfined, with a warning at every run.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from worker.exceptions import ExecutorError
from worker.settings import Settings

# System paths the CLIs, node and python need; each is mounted read-only if it exists
# (a symlink, as /lib on merged-/usr systems, is recreated as a symlink).
SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ssl",
    "/etc/pki",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# The system interpreters that may run the helper inside (the worker's own may live in a home).
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
HELPER = Path(__file__).with_name("sandbox_helper.py")
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """Resource limits of every process in the sandbox (setrlimit; per process except
    ``processes``, counted per user in the sandbox's user namespace)."""

    memory_bytes: int
    processes: int
    file_size_bytes: int
    cpu_seconds: int
    open_files: int = 4096

    @classmethod
    def of(cls, settings: Settings, max_duration_s: float) -> SandboxLimits:
        return cls(
            memory_bytes=settings.cli_sandbox_memory_mb * 1024 * 1024,
            processes=settings.cli_sandbox_max_processes,
            file_size_bytes=settings.cli_sandbox_max_file_mb * 1024 * 1024,
            # No process can use more CPU than the task has wall-clock time.
            cpu_seconds=max(1, math.ceil(max_duration_s)),
        )

    def helper_options(self) -> list[str]:
        values = {
            "memory": self.memory_bytes,
            "processes": self.processes,
            "file_size": self.file_size_bytes,
            "cpu_seconds": self.cpu_seconds,
            "open_files": self.open_files,
            "core": 0,
        }
        options: list[str] = []
        for name, value in values.items():
            options += ["--limit", f"{name}={value}"]
        return options


@dataclass(frozen=True, slots=True, kw_only=True)
class Sandbox:
    """How this host confines a CLI: the bwrap binary, the helper's interpreter, the user."""

    bwrap: str
    python: str
    # The host uid bwrap runs as (the worker is root); None: the worker's own, unprivileged.
    uid: int | None
    extra_read_only: tuple[str, ...] = ()

    def command(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        private: Path,
        relays: Mapping[int, Path],
        limits: SandboxLimits,
    ) -> list[str]:
        """``argv`` wrapped: bwrap, then the helper (relays, limits), then the CLI."""
        command = [
            self.bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "agent-sandbox",
            "--cap-drop",
            "ALL",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
        ]
        for path in [*SYSTEM_PATHS, *self._install_paths(argv[0], self.python)]:
            command += _read_only(path)
        for path in self.extra_read_only:
            command += _read_only(path)
        command += ["--bind", str(workspace), str(workspace)]
        command += ["--ro-bind", str(private), str(private), "--chdir", str(workspace)]
        command += [self.python, str(private / HELPER.name), "run"]
        for port, socket_path in relays.items():
            command += ["--relay", f"{port}={socket_path}"]
        return [*command, *limits.helper_options(), "--", *argv]

    def prepare(self, *directories: Path) -> None:
        """Hand the directories the sandbox sees to its user (when the worker is root)."""
        for directory in directories:
            if self.uid is not None:
                os.chown(directory, self.uid, self.uid)
            directory.chmod(0o700)

    @staticmethod
    def _install_paths(*executables: str) -> list[str]:
        """Where a CLI (or the interpreter) is installed, when that is outside /usr: for an
        npm install the whole node_modules it came from, for a ``<prefix>/bin`` (a
        virtualenv, /opt/<tool>) the prefix, else its directory."""
        paths: list[str] = []
        for executable in executables:
            for candidate in (Path(executable), Path(executable).resolve()):
                parts = candidate.parts
                if "node_modules" in parts:
                    last = len(parts) - 1 - parts[::-1].index("node_modules")
                    paths.append(str(Path(*parts[: last + 1])))
                elif candidate.parent.name == "bin" and len(parts) > 3:
                    paths.append(str(candidate.parent.parent))
                else:
                    paths.append(str(candidate.parent))
        return [path for path in dict.fromkeys(paths) if not _under_system(path)]


def _under_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in ("/usr", "/bin", "/lib"))


def _read_only(path: str) -> list[str]:
    if os.path.islink(path) and os.path.dirname(path) == "/":
        return ["--symlink", os.readlink(path), path]
    if os.path.exists(path):
        return ["--ro-bind", path, path]
    return []


def sandbox_python() -> str | None:
    """A system Python 3 to run the helper inside the sandbox, or None."""
    for candidate in PYTHON_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_sandbox(settings: Settings) -> Sandbox:
    """The sandbox of this host; ExecutorError naming what is missing (fail closed)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ExecutorError(
            "CLI sandbox unavailable: `bwrap` (bubblewrap) is not installed on this worker "
            "(apt-get install bubblewrap; CLI_SANDBOX=off runs CLIs unconfined)"
        )
    python = sandbox_python()
    if python is None:
        raise ExecutorError(
            "CLI sandbox unavailable: no system python3 for its helper "
            f"(looked at {', '.join(PYTHON_CANDIDATES)})"
        )
    return Sandbox(
        bwrap=bwrap,
        python=python,
        uid=settings.cli_sandbox_uid if os.geteuid() == 0 else None,
        extra_read_only=tuple(settings.cli_sandbox_read_only),
    )


def sandbox_problem(settings: Settings) -> str | None:
    """What keeps this host from sandboxing CLIs (None: nothing). Runs bwrap once, as the
    sandbox's user, the way a task would: user, pid and network namespaces included."""
    try:
        sandbox = find_sandbox(settings)
    except ExecutorError as exc:
        return exc.message
    return _probe(sandbox)


@lru_cache(maxsize=4)
def _probe(sandbox: Sandbox) -> str | None:
    command = [
        sandbox.bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    for path in SYSTEM_PATHS:
        command += _read_only(path)
    command += [sandbox.python, "-c", "pass"]
    try:
        completed = subprocess.run(
            command,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            user=sandbox.uid,
            group=sandbox.uid,
            extra_groups=[] if sandbox.uid is not None else None,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"CLI sandbox unavailable: bwrap did not run ({exc})"
    if completed.returncode != 0:
        reason = " ".join(completed.stderr.decode("utf-8", "replace").split())[:300]
        return (
            "CLI sandbox unavailable: bwrap cannot create its namespaces here "
            f"({reason or f'exit status {completed.returncode}'}); the host must allow "
            "unprivileged user namespaces (docs/how-to/cli-agent.md: What the host must allow)"
        )
    return None


def sandbox_warning() -> str:
    return (
        "coding-agent CLIs run unconfined (CLI_SANDBOX=off), as the worker's user, with its "
        "files, processes, secrets and network in reach"
    )


def python_for_bridge(sandbox: Sandbox | None) -> str:
    """The interpreter the CLI's MCP configuration starts the bridge with."""
    if sandbox is not None:
        return sandbox.python
    return sandbox_python() or sys.executable
