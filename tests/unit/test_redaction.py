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


# --- known values spelled out ------------------------------------------------------------

HUB_KEY = "hubkey-7Hq2xZ9pLm4Rt8Vw"


@pytest.mark.parametrize(
    "spelled",
    [
        " ".join(HUB_KEY),  # the attack seen: one space between every character
        "  ".join(HUB_KEY),
        "-".join(HUB_KEY),
        ".".join(HUB_KEY.upper()),
        "_".join(HUB_KEY.lower()),
        "\n".join(HUB_KEY),
        "\u200b".join(HUB_KEY),  # zero-width spaces
        " - ".join(HUB_KEY),  # three separators
        HUB_KEY.replace("-", ""),  # the value's own punctuation left out
        HUB_KEY.swapcase(),
    ],
)
def test_known_values_spelled_out_with_separators_or_in_another_case_are_masked(
    spelled: str,
) -> None:
    text = Redactor([HUB_KEY])(f"my key is {spelled} ok")
    assert text == f"my key is {MASK} ok"


def test_more_than_three_separators_between_characters_is_not_a_spelled_out_value() -> None:
    # The documented limit: four separators apart, the characters no longer read as one value.
    spread = "    ".join(HUB_KEY)
    assert Redactor([HUB_KEY])(spread) == spread


def test_ordinary_text_around_a_known_value_is_left_alone() -> None:
    text = "Deploy the hub key rotation at 7pm; the key is stored in the vault."
    assert Redactor([HUB_KEY])(text) == text


def test_a_known_value_mostly_of_punctuation_is_matched_exactly() -> None:
    value = "--__--a1b2--__--"  # four letters and digits: too few to match spelled out
    redactor = Redactor([value])
    assert redactor(f"x {value} y") == f"x {MASK} y"
    assert redactor("a 1 b 2") == "a 1 b 2"


def test_every_known_value_is_masked_in_one_text() -> None:
    values = [f"canary-{n}-Zq8Wm2Xk4Lp{n}" for n in range(6)]
    text = " and ".join(" ".join(v) if n % 2 else v for n, v in enumerate(values))
    redacted = Redactor(values)(text)
    assert redacted == " and ".join([MASK] * 6)


@pytest.mark.timeout(30)
def test_near_misses_and_separator_floods_end_in_linear_time() -> None:
    # Inputs built to make a backtracking pattern explode: each is one pass here (a hang
    # guard, not a speed check; bench/redaction.py measures the speed).
    redactor = Redactor([HUB_KEY, *(f"{HUB_KEY[:-1]}{n}" for n in range(5))])
    near_misses = (" ".join(HUB_KEY[:-1]) + " !") * 2_000
    separators = "-_ ." * 50_000
    assert redactor(near_misses) == near_misses
    assert redactor(separators) == separators


def test_a_known_value_in_full_width_letters_is_masked() -> None:
    # Full-width letters read as the key to a model; NFKC folds them back.
    full_width = "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in HUB_KEY)
    assert Redactor([HUB_KEY])(f"key: {full_width}!") == f"key: {MASK}!"
    # Text whose folding shows no secret keeps its own characters.
    other = "\uff46\uff55\uff4c\uff4c width, \ufb01ne"  # full-width "full", a ligature
    assert Redactor([HUB_KEY])(other) == other
