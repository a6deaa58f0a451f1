from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.harness import ChaosStack, running_chaos_stack


@pytest.fixture(scope="session")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosStack]:
    """Redis, devhub, MCP servers and the scripted model, shared by the chaos tests."""
    with running_chaos_stack(tmp_path_factory.mktemp("chaos")) as stack:
        yield stack


@pytest.fixture
def chaos(chaos_stack: ChaosStack) -> Iterator[ChaosStack]:
    """The shared stack, reset; the test's workers (and whatever they left) end with it."""
    chaos_stack.reset()
    yield chaos_stack
    chaos_stack.end_workers()
