"""``worker.operations`` is the one door to the operator commands: its names resolve, and
the worker's import of ``check_at_start`` does not load the scheduler or ``status``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import worker.operations


def test_every_public_name_resolves() -> None:
    for name in worker.operations.__all__:
        assert getattr(worker.operations, name) is not None, name


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = worker.operations.nothing_here  # type: ignore[attr-defined]


def test_check_at_start_loads_only_the_checks() -> None:
    probe = (
        "import json, sys\n"
        "from worker.operations import check_at_start\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('worker.operations.'))))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(completed.stdout.strip().splitlines()[-1]))
    assert "worker.operations._checks" in loaded
    assert not loaded & {
        "worker.operations._cli",
        "worker.operations._scheduler",
        "worker.operations._schedule",
        "worker.operations._status",
        "worker.operations._dead_letters",
    }


def test_python_dash_m_is_the_agent_worker_command() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "worker.operations", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: agent-worker")
    for command in ("schedule", "status", "check", "requeue", "dead-letters", "report", "memory"):
        assert command in completed.stdout
