"""The bwrap command line a CLI runs under: what it mounts, and how (no bwrap needed)."""

from __future__ import annotations

from pathlib import Path

from worker.executors._sandbox import Sandbox, SandboxLimits
from worker.settings import Settings


def sandbox_command(tmp_path: Path, **changes: object) -> tuple[list[str], Path, Path]:
    workspace, private = tmp_path / "run" / "workspace", tmp_path / "run" / "cli"
    tool = tmp_path / "opt" / "tool" / "bin" / "tool"  # installed under a prefix
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.touch()
    sandbox = Sandbox(bwrap="/usr/bin/bwrap", python="/usr/bin/python3", uid=65534, **changes)  # type: ignore[arg-type]
    limits = SandboxLimits.of(Settings(cli_sandbox_max_processes=64), 120.5)
    command = sandbox.command(
        [str(tool), "--flag"],
        workspace=workspace,
        private=private,
        relays={3128: private / "model.sock"},
        limits=limits,
    )
    return command, workspace, private


def pairs(command: list[str], option: str) -> list[tuple[str, str]]:
    return [(command[i + 1], command[i + 2]) for i, word in enumerate(command) if word == option]


def test_only_the_workspace_is_writable_and_the_host_is_not_shared(tmp_path: Path) -> None:
    command, workspace, private = sandbox_command(tmp_path)

    assert command[:2] == ["/usr/bin/bwrap", "--unshare-all"]
    assert {"--die-with-parent", "--new-session"} <= set(command)
    assert "--share-net" not in command
    assert pairs(command, "--bind") == [(str(workspace), str(workspace))]
    read_only = dict(pairs(command, "--ro-bind"))
    assert read_only[str(private)] == str(private)
    assert str(tmp_path / "opt" / "tool") in read_only  # the CLI's install prefix
    assert not [path for path in read_only if path.startswith(("/root", "/home", "/work"))]
    assert str(tmp_path) not in read_only and "/tmp" not in read_only
    assert command[command.index("--tmpfs") + 1] == "/tmp"  # its own, empty


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
