"""``make demo``'s choice of model, and a local model's window and time.

A real model is chosen only by ``DEMO_MODEL``: the first-agent guide leaves
``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` exported for its scripted endpoint
(tests/integration/test_demo.py runs the demo in such a shell).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.agents import AgentStore
from worker.dev.demo.__main__ import (
    AGENT,
    DemoModel,
    agents_dir,
    chosen_model,
    unused_keys_note,
    worker_timeout_s,
)


def test_a_local_model_gets_the_window_and_the_time_the_operator_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEMO_MODEL", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "anything")
    monkeypatch.setenv("DEMO_MAX_CONTEXT_TOKENS", "4096")
    monkeypatch.setenv("DEMO_MAX_DURATION_S", "900")
    agents = agents_dir(tmp_path, chosen_model())
    definition = AgentStore(str(agents)).load(AGENT)
    assert definition.config.brain.provider == "openai"
    assert definition.config.brain.max_context_tokens == 4096
    assert definition.config.limits.max_duration_s == 900
    assert worker_timeout_s() == 2 * 900 + 60


def test_without_the_settings_the_demo_agent_is_as_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEMO_MAX_CONTEXT_TOKENS", raising=False)
    monkeypatch.delenv("DEMO_MAX_DURATION_S", raising=False)
    definition = AgentStore(str(agents_dir(tmp_path, DemoModel.OPENAI))).load(AGENT)
    # This worker's extensions, added to the copy of the public-format file.
    assert definition.config.limits.max_cost_usd == 0.05
    assert definition.config.behavior.discovery.post_final is True
    assert definition.config.brain.max_context_tokens is None
    assert definition.config.limits.max_duration_s == 120
    assert worker_timeout_s() == 240


def test_exported_provider_keys_alone_keep_the_scripted_model_and_say_how_to_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DEMO_MODEL", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-guide-8f3b61d2c74e905a")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")

    assert chosen_model() is DemoModel.SCRIPTED
    assert unused_keys_note(DemoModel.SCRIPTED) == (
        "Note: OPENAI_API_KEY set in this shell, not used: DEMO_MODEL=openai runs the demo "
        "against http://127.0.0.1:8090/v1"
    )


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"DEMO_MODEL": "gpt"},
            "DEMO_MODEL='gpt': expected scripted (the default), openai or anthropic",
        ),
        ({"DEMO_MODEL": "anthropic"}, "DEMO_MODEL=anthropic needs ANTHROPIC_API_KEY"),
    ],
)
def test_a_wrong_demo_model_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        chosen_model()
