"""The sandbox every coding-agent CLI runs in: bubblewrap, applied by the worker.

    host (worker)                                 sandbox (bwrap: own user, pid, net, ipc,
                                                  uts and mount namespaces, no nested user
                                                  namespace, a seccomp filter; host uid
                                                  CLI_SANDBOX_UID when the worker is root)
    run dir (0711, root)
    ├── workspace/  ─── a tmpfs of CLI_SANDBOX_WORKSPACE_MB ─▶ the CLI's cwd and HOME
    ├── cli/        ─────────── read-only ──────▶ its prompt files, MCP config, this helper
    │   ├── gateway.sock ◀── mcp_servers.gateway ◀─ bridge (the CLI's only MCP server)
    │   └── model.sock   ◀── model relay (key)  ◀─ 127.0.0.1:3128 (its endpoint)
    ├── gateway-home/ (host only: the gateway's and its servers' HOME)
    └── gateway-calls.jsonl (host only)
    /usr (without /usr/local), /lib…, a few /etc files ─ read-only
    the CLI's package, interpreter and libraries (``_sandbox_mounts``) ─ read-only
    / and /dev read-only; /tmp and /dev/shm: tmpfs of CLI_SANDBOX_TMP_MB each; a fresh
    /proc; no home, no worker files, no network but lo

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
from worker.executors._sandbox_mounts import HIDDEN_ROOTS, install_mounts, mounted_whole
from worker.executors._seccomp import seccomp_descriptor, seccomp_program
from worker.settings import Settings

# System paths the CLIs, node and python need; each is mounted read-only if it exists
# (a symlink, as /lib on merged-/usr systems, is recreated as a symlink). /usr/local is
# hidden under an empty tmpfs: only what a CLI needs there is mounted (_sandbox_mounts).
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
SANDBOX_PATH = "/usr/bin:/bin"
# The system interpreters that may run the helper inside (the worker's own may live in a home).
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
HELPER = Path(__file__).with_name("sandbox_helper.py")
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """Resource limits of the sandbox: setrlimit for every process in it (per process except
    ``processes``, counted per user in the sandbox's user namespace), and the sizes of
    its writable tmpfs mounts (their pages are the host's shared memory)."""

    memory_bytes: int
    processes: int
    file_size_bytes: int
    cpu_seconds: int
    workspace_bytes: int
    tmp_bytes: int
    open_files: int = 4096

    @classmethod
    def of(cls, settings: Settings, max_duration_s: float) -> SandboxLimits:
        mib = 1024 * 1024
        return cls(
            memory_bytes=settings.cli_sandbox_memory_mb * mib,
            processes=settings.cli_sandbox_max_processes,
            file_size_bytes=settings.cli_sandbox_max_file_mb * mib,
            # No process can use more CPU than the task has wall-clock time.
            cpu_seconds=max(1, math.ceil(max_duration_s)),
            workspace_bytes=settings.cli_sandbox_workspace_mb * mib,
            tmp_bytes=settings.cli_sandbox_tmp_mb * mib,
        )

    @property
    def writable_bytes(self) -> int:
        """What the sandbox can hold in files at most: the workspace, /tmp and /dev/shm."""
        return self.workspace_bytes + 2 * self.tmp_bytes

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
        seccomp_fd: int,
    ) -> list[str]:
        """``argv`` wrapped: bwrap, then the helper (relays, limits), then the CLI, which
        runs by its resolved path (its symlink's directory is not mounted)."""
        cli = install_mounts(argv[0])
        command = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
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
            *_tmpfs("/dev/shm", limits.tmp_bytes),
            *_tmpfs("/tmp", limits.tmp_bytes),
        ]
        for path in SYSTEM_PATHS:
            command += _read_only(path)
        for hidden in HIDDEN_ROOTS:
            if os.path.isdir(hidden):
                command += _tmpfs(hidden, 4096)
        for path in self.install_paths(argv[0]):
            command += _read_only(path)
        for path in self.extra_read_only:
            command += _read_only(path)
        command += _tmpfs(str(workspace), limits.workspace_bytes)
        command += ["--ro-bind", str(private), str(private)]
        command += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", str(workspace)]
        command += ["--seccomp", str(seccomp_fd)]
        command += [self.python, str(private / HELPER.name), "run"]
        for port, socket_path in relays.items():
            command += ["--relay", f"{port}={socket_path}"]
        return [*command, *limits.helper_options(), "--", cli.executable, *argv[1:]]

    def install_paths(self, executable: str) -> list[str]:
        """What the sandbox mounts for this CLI and for the helper's python, beyond the
        system paths (what `agent-worker executors` lists)."""
        paths = [*install_mounts(executable).paths, *install_mounts(self.python).paths]
        return list(dict.fromkeys(paths))

    def inside_path(self, executable: str) -> str:
        """PATH inside the sandbox: the CLI's own directory (resolved), then the system's."""
        return f"{Path(install_mounts(executable).executable).parent}:{SANDBOX_PATH}"

    def prepare(self, *directories: Path) -> None:
        """Hand the directories the sandbox sees to its user (when the worker is root)."""
        for directory in directories:
            if self.uid is not None:
                os.chown(directory, self.uid, self.uid)
            directory.chmod(0o700)


def _tmpfs(path: str, size_bytes: int) -> list[str]:
    return ["--size", str(size_bytes), "--tmpfs", path]


def _read_only(path: str) -> list[str]:
    """Mount ``path`` read-only; a symlink into the system mounts stays a symlink (a bind
    would show where it points in /proc/self/mountinfo)."""
    if os.path.islink(path) and (
        os.path.dirname(path) == "/" or mounted_whole(os.path.realpath(path))
    ):
        return ["--symlink", os.readlink(path), path]
    if os.path.exists(path):
        return ["--ro-bind", path, path]
    return []


def sandbox_python() -> str | None:
    """A system Python 3 to run the helper inside the sandbox, or None; symlinks resolved
    (the sandbox mounts the binary, not the links to it: /usr/local is hidden)."""
    for candidate in PYTHON_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
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
    seccomp_program()  # fail closed without libseccomp
    return Sandbox(
        bwrap=bwrap,
        python=python,
        uid=settings.cli_sandbox_uid if os.geteuid() == 0 else None,
        extra_read_only=tuple(settings.cli_sandbox_read_only),
    )


def sandbox_problem(settings: Settings) -> str | None:
    """What keeps this host from sandboxing CLIs (None: nothing). Runs bwrap once, as the
    sandbox's user, the way a task would: user, pid and network namespaces, no nested user
    namespace and the seccomp filter included."""
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
        "--unshare-user",
        "--disable-userns",
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
        with seccomp_descriptor() as seccomp_fd:
            completed = subprocess.run(
                [*command[:-3], "--seccomp", str(seccomp_fd), *command[-3:]],
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
                user=sandbox.uid,
                group=sandbox.uid,
                extra_groups=[] if sandbox.uid is not None else None,
                cwd="/",
                pass_fds=(seccomp_fd,),
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"CLI sandbox unavailable: bwrap did not run ({exc})"
    if completed.returncode != 0:
        reason = " ".join(completed.stderr.decode("utf-8", "replace").split())[:300]
        return (
            "CLI sandbox unavailable: bwrap cannot set up its sandbox here "
            f"({reason or f'exit status {completed.returncode}'}); the host must allow "
            "unprivileged user namespaces and seccomp filters (docs/cli-sandbox.md)"
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
