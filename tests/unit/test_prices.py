"""Price lookup, cost, and the operator's PRICES_FILE."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.exceptions import ConfigurationError
from worker.models._factory import load_price_table
from worker.models._prices import PriceTable
from worker.settings import Settings


def test_exact_names_and_dated_snapshots() -> None:
    table = PriceTable.builtin()
    assert table.cost("claude-sonnet-4-5", 1_000_000, 1_000_000) == pytest.approx(18.0)
    assert table.cost("claude-sonnet-4-5-20250929", 1_000_000, 0) == pytest.approx(3.0)
    assert table.cost("claude-3-5-haiku-latest", 1_000_000, 0) == pytest.approx(0.8)
    assert table.cost("gpt-4o-mini-2024-07-18", 0, 1_000_000) == pytest.approx(0.6)
    assert table.cost("gpt-4o-2024-08-06", 0, 1_000_000) == pytest.approx(10.0)
    assert table.cost("claude-opus-4-20250514", 0, 1_000_000) == pytest.approx(75.0)
    assert table.cost("GPT-5-mini", 1_000_000, 0) == pytest.approx(0.25)


def test_a_different_version_is_not_priced_as_its_prefix() -> None:
    table = PriceTable.builtin()
    # Opus 4.5 costs a third of Opus 4: a prefix match would overcharge it threefold.
    assert table.cost("claude-opus-4-5-20251101", 0, 1_000_000) == pytest.approx(25.0)
    assert table.cost("claude-opus-4-9", 1000, 1000) is None
    assert table.cost("gpt-4o-realtime-preview", 1000, 1000) is None


def test_unknown_model_costs_none_not_zero() -> None:
    table = PriceTable.builtin()
    assert table.cost("llama3.1:8b", 1000, 1000) is None
    assert "llama3.1:8b" not in table
    assert "gpt-4.1" in table


def test_cache_tokens_use_cache_prices() -> None:
    table = PriceTable.builtin()
    # Haiku 4.5: $1 input, $0.10 cache read, $1.25 cache write, $5 output.
    cost = table.cost(
        "claude-haiku-4-5", 1_000_000, 0, cache_read_tokens=500_000, cache_write_tokens=100_000
    )
    assert cost == pytest.approx(0.4 + 0.05 + 0.125)


def test_yaml_merges_over_the_builtin_table(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "models:\n"
        "  gpt-4o: {input_per_mtok: 2.0, output_per_mtok: 8.0}\n"
        "  llama3.1:8b: {input_per_mtok: 0, output_per_mtok: 0}\n"
        "  my-claude:\n"
        "    input_per_mtok: 1\n"
        "    output_per_mtok: 2\n"
        "    cache_read_per_mtok: 0.5\n"
    )
    table = PriceTable.from_yaml(prices)
    assert table.cost("gpt-4o", 1_000_000, 1_000_000) == pytest.approx(10.0)  # overridden
    assert table.cost("gpt-4o-2024-11-20", 1_000_000, 0) == pytest.approx(2.0)  # its snapshot too
    assert table.cost("llama3.1:8b", 5000, 5000) == 0.0  # known and free, unlike unknown
    assert table.cost("my-claude", 1_000_000, 0, cache_read_tokens=1_000_000) == pytest.approx(0.5)
    assert table.cost("claude-haiku-4-5", 1_000_000, 0) == pytest.approx(1.0)  # built-in kept


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [1, 2", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping 'models:"),
        ("models:\n  gpt-x: {output_per_mtok: 1}\n", "models.gpt-x.input_per_mtok: missing"),
        (
            "models:\n  gpt-x: {input_per_mtok: -1, output_per_mtok: 1}\n",
            "models.gpt-x.input_per_mtok: must be a finite number >= 0",
        ),
        (
            "models:\n  gpt-x: {input_per_mtok: cheap, output_per_mtok: 1}\n",
            "models.gpt-x.input_per_mtok: expected a number",
        ),
        (
            "models:\n  gpt-x: {input: 1, input_per_mtok: 1, output_per_mtok: 1}\n",
            "models.gpt-x: unknown field 'input'",
        ),
        ("models:\n  gpt-x: 3\n", "models.gpt-x: expected a mapping of prices"),
    ],
)
def test_bad_price_files_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        PriceTable.from_yaml(prices)
    assert str(prices) in caught.value.message
    assert message in caught.value.message


def test_yaml_syntax_errors_say_where(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  gpt-x: {input_per_mtok: 1\n")
    with pytest.raises(ConfigurationError, match=r"line \d+, column \d+"):
        PriceTable.from_yaml(prices)


def test_missing_price_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        PriceTable.from_yaml(tmp_path / "absent.yaml")


def test_load_price_table_reads_prices_file(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  house-model: {input_per_mtok: 1, output_per_mtok: 1}\n")
    assert "house-model" in load_price_table(Settings(prices_file=prices))
    assert "house-model" not in load_price_table(Settings(prices_file=None))
