"""``agent-worker executors``: which agent types this worker can run, and with what tools.

Use it before giving an agent a CLI ``type``: it says whether the CLI is installed
here, which version answers ``--version``, and whether its agents get tools.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from worker.executors import EXECUTORS, CliExecutor
from worker.executors._sandbox import sandbox_problem, sandbox_python, sandbox_warning
from worker.executors._sandbox_mounts import install_mounts, package_directory
from worker.settings import Settings, settings_or_exit

VERSION_TIMEOUT_S = 10.0
NATIVE_TOOLS = "MCP tools through the worker's grant-checked toolbox"
SHARED_MOUNTS = (
    "read-only /usr (without /usr/local), /bin, /sbin, /lib*, a few /etc files and "
    "CLI_SANDBOX_READ_ONLY; its private files read-only; tmpfs workspace, /tmp, /dev/shm"
)


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    type: str
    binary: str | None
    path: str | None
    installed: bool
    version: str | None
    supports_tools: bool
    tools: str
    # CLIs only: "on", "off (CLI_SANDBOX=off)" or what keeps this host from sandboxing them.
    sandbox: str | None = None
    # CLIs only: how to install it, and what its sandbox mounts read-only for it beyond
    # the system paths (its package, interpreter and libraries; the helper's python's).
    install_command: str | None = None
    mounts: list[str] | None = None


def describe_executors(settings: Settings | None = None) -> list[ExecutorInfo]:
    """One entry per agent type, in registry order; runs each installed CLI's --version
    and, once, the sandbox's probe."""
    settings = settings if settings is not None else settings_or_exit()
    sandbox = _sandbox_state(settings)
    helper_python = sandbox_python()
    infos = []
    with tempfile.TemporaryDirectory(prefix="agent-worker-executors-") as home:
        for agent_type, executor_class in EXECUTORS.items():
            if not issubclass(executor_class, CliExecutor):
                infos.append(
                    ExecutorInfo(
                        type=agent_type,
                        binary=None,
                        path=None,
                        installed=True,
                        version="built in",
                        supports_tools=True,
                        tools=NATIVE_TOOLS,
                    )
                )
                continue
            path = executor_class().executable_path()
            infos.append(
                ExecutorInfo(
                    type=agent_type,
                    binary=executor_class.binary,
                    path=path,
                    installed=path is not None,
                    version=_version(path, home) if path is not None else None,
                    supports_tools=executor_class.speaks_mcp,
                    tools=executor_class.tool_support,
                    sandbox=sandbox,
                    install_command=executor_class.install_command,
                    mounts=_mounts(path, helper_python) if path is not None else None,
                )
            )
    return infos


def _mounts(path: str, helper_python: str | None) -> list[str]:
    """What a CLI's sandbox mounts for it beyond the system paths (``Sandbox.install_paths``)."""
    paths = [*install_mounts(path).paths]
    if helper_python is not None:
        paths += install_mounts(helper_python).paths
    return list(dict.fromkeys(paths))


def _sandbox_state(settings: Settings) -> str:
    if settings.cli_sandbox == "off":
        return "off: " + sandbox_warning()
    return sandbox_problem(settings) or "on"


def _version(path: str, home: str) -> str:
    # A HOME of its own: some CLIs create their state directories on any start.
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, "LANG": "C.UTF-8"}
    try:
        completed = subprocess.run(
            [path, "--version"],
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"unknown (--version did not answer within {VERSION_TIMEOUT_S:g} s)"
    except OSError as exc:
        return f"unknown (cannot run: {exc.strerror})"
    text = completed.stdout.decode("utf-8", "replace") or completed.stderr.decode(
        "utf-8", "replace"
    )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if completed.returncode != 0 or not lines:
        return f"unknown (--version exited with status {completed.returncode})"
    return lines[0][:80]


def main(argv: Sequence[str] | None = None) -> int:
    """List the executors as a table, or as JSON with ``--json``; always exits 0."""
    parser = argparse.ArgumentParser(
        prog="agent-worker executors",
        description="List the agent types (executors) this worker can run: each CLI's "
        "binary, whether it is installed here, its version, and whether its agents get tools.",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array instead")
    options = parser.parse_args(argv)
    infos = describe_executors()
    if options.json:
        print(json.dumps([asdict(info) for info in infos], indent=2))
        return 0
    sandbox = next((info.sandbox for info in infos if info.sandbox is not None), None)
    rows = [("TYPE", "BINARY", "INSTALLED", "VERSION", "TOOLS")]
    for info in infos:
        installed = "yes" if info.installed else "no"
        rows.append(
            (
                info.type,
                info.binary or "-",
                installed if info.binary is None or info.installed else "not installed",
                info.version or "-",
                info.tools,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]).rstrip())
    if sandbox is not None:
        state = "on: bwrap confines every CLI run" if sandbox == "on" else sandbox
        print(f"\nsandbox: {state}")
        print(f"  every CLI: {SHARED_MOUNTS}")
    for info in infos:
        if info.binary is None:
            continue
        if not info.installed:
            print(f"  {info.type}: not installed; install with `{info.install_command}`")
            continue
        extra = ", ".join(info.mounts or []) or "nothing (all under /usr)"
        runs = install_mounts(info.path).executable if info.path else "-"
        print(f"  {info.type}: runs {runs} (package {package_directory(runs)})")
        print(f"  {' ' * len(info.type)}  mounts for it, beyond the above: {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
