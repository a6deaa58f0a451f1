"""Every shell block of the getting-started pages and the how-to guides is run or checked.

``GUIDES`` names, for each page with ``sh`` blocks, how many it has and the tests that run
them (extracted from the page) or mirror them line by line. A new block, or a page that gains
its first one, fails here until a test covers it. The checks below mirror the blocks that
need what a test run cannot have (Docker, a cluster, root, a built model).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from worker.executors._listing import describe_executors

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)

# page -> (its sh blocks, the tests that run or mirror them: path::function)
GUIDES: dict[str, tuple[int, tuple[str, ...]]] = {
    "first-agent.md": (
        13,
        (
            "tests/integration/test_first_agent_guide.py::test_the_first_agent_guide_runs_as_written",
        ),
    ),
    "getting-started/demo.md": (
        1,
        (
            "tests/unit/test_docs_commands.py::test_the_demo_pages_commands_are_the_make_targets",
            "tests/integration/test_demo.py::test_demo_in_the_guides_shell_uses_a_throwaway_redis_and_the_scripted_model",
        ),
    ),
    "how-to/cli-agent.md": (
        1,
        (
            "tests/unit/test_docs_commands.py::test_the_cli_guide_installs_the_binaries_the_executors_run",
            "tests/integration/test_executors_cli.py::test_claude_code_answers_through_the_gateway_into_the_report",
        ),
    ),
    "how-to/deploy-compose.md": (
        1,
        (
            "tests/unit/test_docs_commands.py::test_the_compose_guide_names_the_shipped_files",
            "tests/integration/test_shipped_files.py::test_compose_passes_the_compose_specification_schema",
        ),
    ),
    "how-to/deploy-kubernetes.md": (
        1,
        (
            "tests/unit/test_docs_commands.py::test_the_kubernetes_guide_applies_the_shipped_kustomization",
            "tests/integration/test_kubernetes.py::test_core_objects_are_valid_for_kubernetes",
        ),
    ),
    "how-to/deploy-systemd.md": (
        1,
        (
            "tests/integration/test_deploy.py::test_systemd_steps_install_the_definitions_and_check_before_starting",
        ),
    ),
    "how-to/hosted-model.md": (
        3,
        (
            "tests/integration/test_first_agent_guide.py::test_the_hosted_model_guide_runs_with_the_scripted_endpoint_as_the_provider",
        ),
    ),
    "how-to/tools.md": (
        1,
        (
            "tests/integration/test_first_agent_guide.py::test_the_tool_guide_runs_in_the_first_agents_shell",
        ),
    ),
    "how-to/local-model.md": (
        1,
        (
            "tests/unit/test_docs_commands.py::test_the_local_model_guide_starts_a_server_the_code_offers",
            "tests/unit/test_demo_local_model.py::test_a_local_model_gets_the_window_and_the_time_the_operator_sets",
        ),
    ),
}
GUIDE_PAGES = sorted(
    [DOCS / "first-agent.md", *DOCS.glob("getting-started/*.md"), *DOCS.glob("how-to/*.md")]
)


def shell_blocks(page: str) -> list[str]:
    return SHELL_BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))


def command_lines(page: str) -> list[str]:
    """The commands of a page's blocks, comments and continuations folded."""
    text = "\n".join(shell_blocks(page)).replace("\\\n", " ")
    lines = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize("page", GUIDE_PAGES, ids=lambda path: str(path.relative_to(DOCS)))
def test_every_shell_block_of_the_guides_has_a_test(page: Path) -> None:
    relative = str(page.relative_to(DOCS))
    blocks = shell_blocks(relative)
    if not blocks:
        assert relative not in GUIDES, "a page without sh blocks listed in GUIDES"
        return
    assert relative in GUIDES, f"{relative}: its shell blocks need a test (see GUIDES)"
    count, tests = GUIDES[relative]
    assert len(blocks) == count, f"{relative} has {len(blocks)} shell blocks: cover the new one"
    for test in tests:
        path, function = test.split("::")
        assert f"def {function}(" in (REPO / path).read_text(encoding="utf-8"), test


def test_the_demo_pages_commands_are_the_make_targets() -> None:
    assert command_lines("getting-started/demo.md") == ["make demo", "make test"]
    dry_run = subprocess.run(
        ["make", "-n", "-C", str(REPO), "demo", "test"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-m worker.dev.demo" in dry_run
    assert "mkdocs build --strict" in dry_run and "pytest" in dry_run


def test_the_compose_guide_names_the_shipped_files() -> None:
    assert command_lines("how-to/deploy-compose.md") == [
        "cp deploy/.env.example deploy/.env && chmod 600 deploy/.env",
        "docker compose -f deploy/compose.yaml up -d --build",
    ]
    assert (REPO / "deploy" / ".env.example").is_file()
    assert (REPO / "deploy" / "compose.yaml").is_file()


def test_the_kubernetes_guide_applies_the_shipped_kustomization() -> None:
    assert command_lines("how-to/deploy-kubernetes.md") == ["kubectl apply -k deploy/kubernetes"]
    assert (REPO / "deploy" / "kubernetes" / "kustomization.yaml").is_file()


def test_the_local_model_guide_starts_a_server_the_code_offers() -> None:
    serve, demo = command_lines("how-to/local-model.md")
    assert serve == ".venv/bin/python -m worker.dev.realmodel serve --model 1.5b &"
    offered = subprocess.run(
        [sys.executable, "-m", "worker.dev.realmodel", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "1.5b" in offered
    assert demo.endswith("make demo") and "OPENAI_BASE_URL=" in demo
    assert {"DEMO_MAX_CONTEXT_TOKENS", "DEMO_MAX_DURATION_S", "LLM_TIMEOUT_S"} <= set(
        re.findall(r"\b([A-Z_]+)=", demo)
    )


def test_the_cli_guide_installs_the_binaries_the_executors_run() -> None:
    # npm's @anthropic-ai/claude-code installs `claude`, opencode-ai installs `opencode`.
    install, listing = command_lines("how-to/cli-agent.md")
    assert install == "npm install -g @anthropic-ai/claude-code opencode-ai"
    assert listing == "agent-worker executors"
    binaries = {info.type: info.binary for info in describe_executors()}
    assert binaries["claude-code"] == "claude" and binaries["opencode"] == "opencode"
