"""Settings: one object from the environment; a bad value is one line naming the variable."""

from __future__ import annotations

import pytest

from worker.exceptions import ConfigurationError
from worker.redaction import secrets_from_environment
from worker.settings import Settings, load_settings


def test_defaults_match_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "REDIS_URL",
        "METRICS_PORT",
        "ERRORS_AGENT_ID",
        "STRICT_GRANTS",
        "WORKER_CONCURRENCY",
    ):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.metrics_port == 9108
    assert settings.errors_agent_id == "agent-worker"
    assert settings.strict_grants is False
    assert settings.worker_concurrency == 1  # rq's fork per job unless asked


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("METRICS_PORT", "not-a-port"),
        ("METRICS_PORT", "70000"),
        ("STRICT_GRANTS", "maybe"),
        ("LOG_LEVEL", "chatty"),
        ("REQUEUE_MAX_ATTEMPTS", "-1"),
        ("WORKER_CONCURRENCY", "0"),
    ],
)
def test_an_invalid_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=f"invalid setting {variable}:"):
        load_settings()


def test_secrets_are_never_in_the_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUB_API_KEY", "hub-key-that-must-not-show")
    settings = load_settings()
    assert "hub-key-that-must-not-show" not in repr(settings)
    assert "hub-key-that-must-not-show" in settings.secret_values()


def test_a_setting_whose_name_reads_as_a_secret_holds_one() -> None:
    # The redactor masks the value of every variable whose name holds KEY, TOKEN, SECRET...
    # A flag so named (OPENAI_PROMPT_CACHE_KEY=false) would mask every "false" in prompts,
    # reports and logs. AGENT_KEY_ENVS holds only variable names.
    read_as_secrets = {
        name
        for name, field in Settings.model_fields.items()
        if secrets_from_environment({name.upper(): "value"})
        and "SecretStr" not in str(field.annotation)
    }
    assert read_as_secrets == {"agent_key_envs"}
