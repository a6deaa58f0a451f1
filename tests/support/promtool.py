"""Find Prometheus's ``promtool`` and server for the deploy tests, installing them on Debian
when allowed.

Use ``find_promtool()`` and skip when it answers None::

    promtool = find_promtool()
    if promtool is None:
        pytest.skip(PROMTOOL_MISSING)

When ``promtool`` is not on PATH and the tests run as root on a system with
``apt-get`` (a CI container), Debian's ``prometheus`` package is installed once
per test session. On a host running systemd the package also enables and starts
a Prometheus server, which is why this never happens for a non-root user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from functools import cache
from pathlib import Path

# The deploy's Prometheus rules and Grafana dashboard, which the deploy tests check and the
# Prometheus chaos test loads into a real server.
PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
DASHBOARD = (
    Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "agent-worker.json"
)
# What Grafana puts in for a dashboard's variables, for a query Prometheus can run.
GRAFANA_SUBSTITUTES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$agent": ".*",
}

PROMTOOL_MISSING = "promtool not available: install Debian package prometheus"

INSTALL_TIMEOUT_S = 300.0
_INSTALL_COMMAND = ("apt-get", "install", "-y", "--no-install-recommends", "prometheus")
_UPDATE_COMMAND = ("apt-get", "update")
# What apt-get says when its package lists are missing or too old to know the package.
_NO_LISTS_SIGNS = ("Unable to locate package", "has no installation candidate")


PROMETHEUS_MISSING = "prometheus not available: install Debian package prometheus"


def find_promtool() -> str | None:
    """The path of ``promtool``, installing it when possible; None when it is not available."""
    return _find_in_package("promtool")


def find_prometheus() -> str | None:
    """The path of the ``prometheus`` server (the same package), as ``find_promtool``."""
    return _find_in_package("prometheus")


@cache
def _find_in_package(program: str) -> str | None:
    found = shutil.which(program)
    if found is not None:
        return found
    if not _may_install():
        return None
    _install_prometheus_package(deadline=time.monotonic() + INSTALL_TIMEOUT_S)
    return shutil.which(program)


def _may_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _install_prometheus_package(*, deadline: float) -> None:
    install = _run_apt(_INSTALL_COMMAND, deadline=deadline)
    if install is None or install.returncode == 0:
        return
    if any(sign in install.stdout for sign in _NO_LISTS_SIGNS):
        update = _run_apt(_UPDATE_COMMAND, deadline=deadline)
        if update is not None and update.returncode == 0:
            _run_apt(_INSTALL_COMMAND, deadline=deadline)


def _run_apt(
    command: tuple[str, ...], *, deadline: float
) -> subprocess.CompletedProcess[str] | None:
    """Run one apt-get command quietly within what is left of the deadline; None on timeout.

    apt-get runs in its own session so that a timeout stops dpkg and its helpers too.
    """
    remaining_s = deadline - time.monotonic()
    if remaining_s <= 0:
        return None
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        output, _ = process.communicate(timeout=remaining_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None
    return subprocess.CompletedProcess(command, process.returncode, output)


def substituted(expression: str) -> str:
    """A dashboard's query with Grafana's variables put in."""
    for variable, value in GRAFANA_SUBSTITUTES.items():
        expression = expression.replace(variable, value)
    return expression
