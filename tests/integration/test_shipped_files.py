"""The files an operator copies, read as the tools that consume them read them.

Every shipped YAML parses strictly (a key given twice is refused, as Docker Compose and
kubectl refuse it; a file of several documents is read whole), deploy/compose.yaml passes
the compose specification's JSON Schema (the one check-jsonschema ships), and every worker
command the docs and the Procfile give starts rq with our settings module.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.strict_yaml import DuplicateKey, load_documents

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose.yaml"
SHIPPED_YAML = sorted(
    path
    for folder in (REPO / "deploy", REPO / "worker")
    for pattern in ("*.yaml", "*.yml")
    for path in folder.rglob(pattern)
)
CHECK_JSONSCHEMA = str(Path(sys.executable).parent / "check-jsonschema")


def test_the_shipped_yaml_files_are_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in SHIPPED_YAML}
    assert {"deploy/compose.yaml", "deploy/kubernetes/base/worker.yaml", "deploy/mcp.yaml"} <= names
    assert "worker/dev/demo/agents/agents/demo-agent/config.yaml" in names


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_shipped_yaml_parses_strictly_and_whole(path: Path) -> None:
    documents = load_documents(path)
    # Each "---" that starts a document yields one; none is dropped or left unread.
    separators = len(re.findall(r"^---\s*$", path.read_text(encoding="utf-8"), re.MULTILINE))
    assert len(documents) in {separators, separators + 1}
    assert any(document is not None for document in documents)


def test_the_strict_reader_refuses_a_repeated_key_and_reads_every_document(
    tmp_path: Path,
) -> None:
    repeated = tmp_path / "repeated.yaml"
    repeated.write_text("environment:\n  KEY: a\n  OTHER: b\n  KEY: a\n")
    assert yaml.safe_load(repeated.read_text()) == {"environment": {"KEY": "a", "OTHER": "b"}}
    with pytest.raises(DuplicateKey, match="found the key 'KEY' a second time"):
        load_documents(repeated)
    several = tmp_path / "several.yaml"
    several.write_text("kind: A\n---\nkind: B\n---\nkind: C\n")
    assert [document["kind"] for document in load_documents(several)] == ["A", "B", "C"]


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHECK_JSONSCHEMA, "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_passes_the_compose_specification_schema() -> None:
    completed = check_compose(COMPOSE)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_compose_check_refuses_a_repeated_key_and_a_misspelt_field(tmp_path: Path) -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    repeated = tmp_path / "repeated.yaml"
    line = next(line for line in text.splitlines() if line.strip().startswith("CAPABILITY_KEY:"))
    repeated.write_text(text.replace(line, f"{line}\n{line}", 1))
    assert "duplicate key" in check_compose(repeated).stdout.lower()
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(text.replace("depends_on:", "depend_on:", 1))
    completed = check_compose(misspelt)
    assert completed.returncode == 1 and "depend_on" in completed.stdout


# A worker command as given to a user: the worker class, then `rq worker`.
WORKER_COMMAND = re.compile(r"RQ_WORKER_CLASS=worker\.AgentWorker[^`\n\"]*rq\b[^`\n\"]* worker ")


@pytest.mark.parametrize(
    "relative",
    [
        "README.md",
        "docs/first-agent.md",
        "docs/how-to/hosted-model.md",
        "docs/concepts/pipeline.md",
    ],
)
def test_every_worker_command_given_to_users_sets_rq_config(relative: str) -> None:
    # A command continued on the next line (a trailing backslash) is one command.
    text = (REPO / relative).read_text(encoding="utf-8").replace("\\\n", " ")
    commands = [match.group(0) for match in WORKER_COMMAND.finditer(text)]
    assert commands, relative
    for command in commands:
        assert "RQ_CONFIG=worker.rq_config" in command, (relative, command)


def test_the_procfile_runs_the_pool_with_the_worker_class_and_rq_settings() -> None:
    (line,) = [
        line
        for line in (REPO / "Procfile").read_text(encoding="utf-8").splitlines()
        if line.startswith("worker:")
    ]
    words = line.partition(": ")[2].split()
    assert words[-2:] == ["agent-worker", "pool"]
    assert {"RQ_WORKER_CLASS=worker.AgentWorker", "RQ_CONFIG=worker.rq_config"} <= set(words)
