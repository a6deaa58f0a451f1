"""Build a kustomization as ``kubectl apply -k`` would, for the deploy tests.

``kustomize build`` when the standalone binary is on PATH, else ``kubectl kustomize``
(kubectl has carried kustomize since 1.14; ``labels:`` needs its kustomize 4.1 or newer,
kubectl 1.21 or newer). ``kustomize_command()`` is None when neither is installed: the
tests that build skip with ``KUSTOMIZE_MISSING``. Debian's ``kubernetes-client`` (kubectl
1.20) is too old to build these manifests, so nothing is installed here.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZE_MISSING = "neither kustomize nor kubectl (1.21 or newer) is on PATH"
BUILD_TIMEOUT_S = 60.0


@cache
def kustomize_command() -> tuple[str, ...] | None:
    """The command that builds a kustomization directory given as its last argument."""
    if (kustomize := shutil.which("kustomize")) is not None:
        return (kustomize, "build")
    if (kubectl := shutil.which("kubectl")) is not None:
        return (kubectl, "kustomize")
    return None


def kustomize_build(directory: Path) -> subprocess.CompletedProcess[str]:
    """The build of ``directory``; its return code and stderr say whether it failed."""
    command = kustomize_command()
    assert command is not None, KUSTOMIZE_MISSING
    return subprocess.run(
        [*command, str(directory)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )


def built_objects(directory: Path) -> list[dict[str, Any]]:
    """The objects ``directory`` builds to; fails the test with kustomize's message if none."""
    built = kustomize_build(directory)
    assert built.returncode == 0, built.stderr
    return [document for document in yaml.safe_load_all(built.stdout) if document]
