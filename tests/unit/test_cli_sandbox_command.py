"""The bwrap command line a CLI runs under: what it mounts, and how (no bwrap needed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from worker.executors._sandbox import Sandbox, SandboxLimits
from worker.executors._sandbox_mounts import install_mounts, package_directory
from worker.executors._seccomp import DENIED_SYSCALLS, seccomp_descriptor, seccomp_program
from worker.settings import Settings

SECCOMP_FD = 9


def sandbox_command(
    tmp_path: Path, tool: Path | None = None, **changes: object
) -> tuple[list[str], Path, Path]:
    workspace, private = tmp_path / "run" / "workspace", tmp_path / "run" / "cli"
    if tool is None:
        tool = tmp_path / "opt" / "tool" / "bin" / "tool"  # installed under a prefix
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_bytes(b"\x7fELF")
        tool.chmod(0o755)
    sandbox = Sandbox(bwrap="/usr/bin/bwrap", python="/usr/bin/python3", uid=65534, **changes)  # type: ignore[arg-type]
    settings = Settings(
        cli_sandbox_max_processes=64, cli_sandbox_workspace_mb=100, cli_sandbox_tmp_mb=20
    )
    command = sandbox.command(
        [str(tool), "--flag"],
        workspace=workspace,
        private=private,
        relays={3128: private / "model.sock"},
        limits=SandboxLimits.of(settings, 120.5),
        seccomp_fd=SECCOMP_FD,
    )
    return command, workspace, private


def pairs(command: list[str], option: str) -> list[tuple[str, str]]:
    return [(command[i + 1], command[i + 2]) for i, word in enumerate(command) if word == option]


def tmpfs_sizes(command: list[str]) -> dict[str, int]:
    """Each tmpfs mount and the size bwrap gives it (``--size N --tmpfs PATH``)."""
    return {
        command[i + 3]: int(command[i + 1])
        for i, word in enumerate(command)
        if word == "--size" and command[i + 2] == "--tmpfs"
    }


def test_only_the_workspace_is_writable_and_the_host_is_not_shared(tmp_path: Path) -> None:
    command, _, private = sandbox_command(tmp_path)

    assert command[:2] == ["/usr/bin/bwrap", "--unshare-all"]
    assert {"--die-with-parent", "--new-session", "--unshare-user", "--disable-userns"} <= set(
        command
    )
    assert "--share-net" not in command and "--bind" not in command
    read_only = dict(pairs(command, "--ro-bind"))
    assert read_only[str(private)] == str(private)
    assert not [path for path in read_only if path.startswith(("/root", "/home", "/work"))]
    assert str(tmp_path) not in read_only and "/tmp" not in read_only
    assert pairs(command, "--remount-ro") == [("/dev", "--remount-ro"), ("/", "--chdir")]
    assert command[command.index("--seccomp") + 1] == str(SECCOMP_FD)


def test_every_writable_mount_is_a_tmpfs_of_a_set_size(tmp_path: Path) -> None:
    command, workspace, _ = sandbox_command(tmp_path)
    sizes = tmpfs_sizes(command)
    mib = 1024 * 1024

    assert sizes[str(workspace)] == 100 * mib
    assert sizes["/tmp"] == sizes["/dev/shm"] == 20 * mib
    if os.path.isdir("/usr/local"):
        assert sizes["/usr/local"] == 4096  # hidden: only what a CLI needs there is mounted
    limits = SandboxLimits.of(Settings(cli_sandbox_workspace_mb=100, cli_sandbox_tmp_mb=20), 9)
    assert limits.writable_bytes == 140 * mib


def test_a_cli_under_a_prefix_mounts_its_file_not_the_prefix(tmp_path: Path) -> None:
    (tmp_path / "opt" / "tool" / "etc").mkdir(parents=True)
    (tmp_path / "opt" / "tool" / "etc" / "secret.key").write_text("x")
    command, _, _ = sandbox_command(tmp_path)
    tool = tmp_path / "opt" / "tool" / "bin" / "tool"
    mounted = [source for source, _ in pairs(command, "--ro-bind")]

    assert str(tool) in mounted
    assert str(tmp_path / "opt" / "tool") not in mounted
    assert str(tool.parent) not in mounted
    assert command[command.index("--") + 1 :] == [str(tool), "--flag"]


def test_a_cli_found_through_a_symlink_runs_from_its_npm_package(tmp_path: Path) -> None:
    package = tmp_path / "prefix" / "lib" / "node_modules" / "@acme" / "coder"
    (package / "bin").mkdir(parents=True)
    binary = package / "bin" / "coder.exe"
    binary.write_bytes(b"\x7fELF")
    binary.chmod(0o755)
    (tmp_path / "prefix" / "bin").mkdir()
    link = tmp_path / "prefix" / "bin" / "coder"
    link.symlink_to(binary)
    (tmp_path / "prefix" / "bin" / "other-tool").write_text("#!/bin/sh\n")
    command, _, _ = sandbox_command(tmp_path, tool=link)
    mounted = [source for source, _ in pairs(command, "--ro-bind")]

    assert str(package) in mounted
    assert not [path for path in mounted if path.startswith(str(tmp_path / "prefix" / "bin"))]
    assert str(tmp_path / "prefix") not in mounted
    assert command[command.index("--") + 1] == str(binary)  # the resolved path runs
    assert package_directory(str(tmp_path / "node_modules" / "plain" / "x.js")) == str(
        tmp_path / "node_modules" / "plain"
    )


def test_a_script_mounts_its_interpreter_and_what_it_imports_not_its_virtualenv(
    tmp_path: Path,
) -> None:
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.skip("the tests do not run in a virtualenv")
    script = tmp_path / "bin" / "coder"
    script.parent.mkdir()
    script.write_text(f"#!{venv / 'bin' / 'python'}\nprint('hi')\n")
    mounts = install_mounts(str(script))

    assert str(script) in mounts.paths
    assert str(venv / "bin" / "python") in mounts.paths
    assert str(venv / "pyvenv.cfg") in mounts.paths
    assert [path for path in mounts.paths if "site-packages" in path]
    assert str(venv) not in mounts.paths and str(venv / "bin") not in mounts.paths


def test_an_interpreter_outside_the_system_paths_comes_with_its_standard_library() -> None:
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    if str(base_python).startswith("/usr/") and not str(base_python).startswith("/usr/local/"):
        pytest.skip("the tests' Python is the system's, mounted with /usr")
    mounts = install_mounts(str(base_python))

    assert os.path.dirname(os.__file__) in mounts.paths  # the helper imports from it
    assert not [path for path in mounts.paths if "site-packages" in path]


def test_the_helper_relays_the_model_port_sets_the_limits_then_runs_the_cli(
    tmp_path: Path,
) -> None:
    command, _, private = sandbox_command(tmp_path)
    helper = command.index(str(private / "sandbox_helper.py"))

    assert command[helper - 1] == "/usr/bin/python3" and command[helper + 1] == "run"
    tail = command[helper + 2 :]
    assert tail[tail.index("--") + 1 :] == [str(tmp_path / "opt/tool/bin/tool"), "--flag"]
    limits = [tail[i + 1] for i, word in enumerate(tail) if word == "--limit"]
    assert "processes=64" in limits and "cpu_seconds=121" in limits and "core=0" in limits
    assert f"3128={private / 'model.sock'}" in tail


def test_operator_paths_are_mounted_read_only(tmp_path: Path) -> None:
    extra = tmp_path / "tools"
    extra.mkdir()
    command, _, _ = sandbox_command(tmp_path, extra_read_only=(str(extra),))

    assert (str(extra), str(extra)) in pairs(command, "--ro-bind")


def test_the_seccomp_program_compiles_and_reaches_bwrap_through_a_descriptor() -> None:
    program = seccomp_program()

    # A BPF program is 8-byte instructions: at least one test per denied system call.
    assert len(program) % 8 == 0 and len(program) // 8 > len(DENIED_SYSCALLS)
    with seccomp_descriptor() as descriptor:
        assert os.read(descriptor, len(program) + 1) == program
