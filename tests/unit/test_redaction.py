"""Redaction: known secret values and secret-shaped strings never leave the process."""

from __future__ import annotations

import io
import json

import pytest

from worker import logs
from worker.redaction import MASK, Redactor, secrets_from_environment


@pytest.mark.parametrize(
    "secret",
    [
        "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
        "sk-proj-abcdefghijklmnopqrstuvwx",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
        "xoxb-1234567890-abcdefghij",
        "AKIAABCDEFGHIJKLMNOP",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ],
)
def test_secret_shapes_are_masked(secret: str) -> None:
    text = Redactor().redact(f"the value was {secret} here")
    assert secret not in text and MASK in text


def test_known_values_are_masked_even_without_a_recognisable_shape() -> None:
    redactor = Redactor(["plain-looking-hub-key-42"])
    assert redactor("Authorization failed for plain-looking-hub-key-42") == (
        f"Authorization failed for {MASK}"
    )


def test_short_values_are_not_treated_as_secrets() -> None:
    assert Redactor(["abc"])("abc is fine") == "abc is fine"


def test_passwords_in_urls_and_bearer_tokens_are_masked() -> None:
    redactor = Redactor()
    assert redactor("postgres://app:s3cretpass@db:5432/x") == f"postgres://app:{MASK}@db:5432/x"
    assert redactor("Authorization: Bearer abcdef123456789") == f"Authorization: Bearer {MASK}"


def test_environment_secrets_are_collected_by_name() -> None:
    env = {"GITHUB_TOKEN": "t0ken-value", "DB_PASSWORD": "pw-value-1", "HOME": "/root"}
    assert sorted(secrets_from_environment(env)) == ["pw-value-1", "t0ken-value"]


def test_log_lines_are_redacted() -> None:
    stream = io.StringIO()
    logs.set_stream(stream)
    logs.set_redactor(Redactor(["canary-secret-value"]))
    try:
        logs.log_event(
            "test_event", detail="leaked canary-secret-value", nested={"k": ["canary-secret-value"]}
        )
    finally:
        logs.set_stream(None)
        logs.set_redactor(str)
    line = json.loads(stream.getvalue())
    assert "canary-secret-value" not in stream.getvalue()
    assert line["event"] == "test_event" and line["level"] == "info" and "ts" in line
