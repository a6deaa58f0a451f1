"""``make demo`` against a local model: the window and the time the operator gives it."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.agents import AgentStore
from worker.dev.demo.__main__ import AGENT, agents_dir, worker_timeout_s


def test_a_local_model_gets_the_window_and_the_time_the_operator_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "anything")
    monkeypatch.setenv("DEMO_MAX_CONTEXT_TOKENS", "4096")
    monkeypatch.setenv("DEMO_MAX_DURATION_S", "900")
    agents, label = agents_dir(tmp_path)
    definition = AgentStore(str(agents)).load(AGENT)
    assert label.startswith("openai ")
    assert definition.config.brain.max_context_tokens == 4096
    assert definition.config.limits.max_duration_s == 900
    assert worker_timeout_s() == 2 * 900 + 60


def test_without_the_settings_the_demo_agent_is_as_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "anything")
    monkeypatch.delenv("DEMO_MAX_CONTEXT_TOKENS", raising=False)
    monkeypatch.delenv("DEMO_MAX_DURATION_S", raising=False)
    agents, _ = agents_dir(tmp_path)
    definition = AgentStore(str(agents)).load(AGENT)
    assert definition.config.brain.max_context_tokens is None
    assert definition.config.limits.max_duration_s == 120
    assert worker_timeout_s() == 240
