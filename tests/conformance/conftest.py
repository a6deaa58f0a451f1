from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.harness import ChaosStack, running_chaos_stack


@pytest.fixture(scope="session")
def conformance_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosStack]:
    """Redis, devhub, MCP servers and the scripted model, shared by the conformance tests."""
    with running_chaos_stack(tmp_path_factory.mktemp("conformance")) as stack:
        yield stack


@pytest.fixture
def stack(conformance_stack: ChaosStack) -> Iterator[ChaosStack]:
    """The shared stack, reset; the test's workers (and whatever they left) end with it."""
    conformance_stack.reset()
    yield conformance_stack
    conformance_stack.end_workers()
