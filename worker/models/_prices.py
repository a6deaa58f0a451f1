"""Per-model token prices, and the cost of one call.

Use ``PriceTable.builtin()`` for the published list prices, or
``PriceTable.from_yaml(path)`` to merge an operator's ``PRICES_FILE`` over them::

    models:
      claude-sonnet-4-5: {input_per_mtok: 3.0, output_per_mtok: 15.0}
      my-local-llama: {input_per_mtok: 0, output_per_mtok: 0}

A model missing from the table has an unknown cost (``None``), never zero.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from worker.exceptions import ConfigurationError

_PER_MILLION = 1_000_000


@dataclass(slots=True, kw_only=True, frozen=True)
class ModelPrice:
    """USD per million tokens. Cache prices default to the input price (never an underestimate)."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None
    # A write kept for an hour (Anthropic's 1h TTL); unset: the cache-write price.
    cache_write_1h_per_mtok: float | None = None

    @property
    def write_price(self) -> float:
        """The price of a cache write kept the provider's default time."""
        if self.cache_write_per_mtok is None:
            return self.input_per_mtok
        return self.cache_write_per_mtok

    @property
    def write_1h_price(self) -> float:
        if self.cache_write_1h_per_mtok is None:
            return self.write_price
        return self.cache_write_1h_per_mtok

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> float:
        """``input_tokens`` counts every input token, cached ones included;
        ``cache_write_1h_tokens`` counts the part of ``cache_write_tokens`` kept for an hour."""
        fresh_input = max(input_tokens - cache_read_tokens - cache_write_tokens, 0)
        read_price = (
            self.input_per_mtok if self.cache_read_per_mtok is None else self.cache_read_per_mtok
        )
        hour = min(cache_write_1h_tokens, cache_write_tokens)
        total = (
            fresh_input * self.input_per_mtok
            + cache_read_tokens * read_price
            + (cache_write_tokens - hour) * self.write_price
            + hour * self.write_1h_price
            + output_tokens * self.output_per_mtok
        )
        return total / _PER_MILLION


def _anthropic(input_per_mtok: float, output_per_mtok: float) -> ModelPrice:
    # Anthropic bills cache reads at 0.1x, 5-minute cache writes at 1.25x and 1-hour ones
    # at 2x the input price.
    return ModelPrice(
        input_per_mtok=input_per_mtok,
        output_per_mtok=output_per_mtok,
        cache_read_per_mtok=input_per_mtok * 0.1,
        cache_write_per_mtok=input_per_mtok * 1.25,
        cache_write_1h_per_mtok=input_per_mtok * 2.0,
    )


def _openai(input_per_mtok: float, output_per_mtok: float, cached_input: float) -> ModelPrice:
    # OpenAI caches prompts itself: cached tokens are part of the prompt, billed at a discount.
    return ModelPrice(
        input_per_mtok=input_per_mtok,
        output_per_mtok=output_per_mtok,
        cache_read_per_mtok=cached_input,
    )


# Published list prices (standard tier, short context), USD per million tokens.
_BUILTIN_PRICES: dict[str, ModelPrice] = {
    # Anthropic
    "claude-opus-5-5": _anthropic(4.0, 20.0),
    "claude-opus-5": _anthropic(5.0, 25.0),
    "claude-sonnet-5-5": _anthropic(2.0, 10.0),
    "claude-sonnet-5": _anthropic(2.0, 10.0),
    "claude-fable-5-1": _anthropic(10.0, 50.0),
    "claude-opus-4-8": _anthropic(5.0, 25.0),
    "claude-opus-4-7": _anthropic(5.0, 25.0),
    "claude-opus-4-6": _anthropic(5.0, 25.0),
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4-1": _anthropic(15.0, 75.0),
    "claude-opus-4-0": _anthropic(15.0, 75.0),
    "claude-opus-4": _anthropic(15.0, 75.0),
    "claude-sonnet-4-6": _anthropic(3.0, 15.0),
    "claude-sonnet-4-5": _anthropic(3.0, 15.0),
    "claude-sonnet-4-0": _anthropic(3.0, 15.0),
    "claude-sonnet-4": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    "claude-3-7-sonnet": _anthropic(3.0, 15.0),
    "claude-3-5-sonnet": _anthropic(3.0, 15.0),
    "claude-3-5-haiku": _anthropic(0.8, 4.0),
    "claude-3-opus": _anthropic(15.0, 75.0),
    "claude-3-haiku": _anthropic(0.25, 1.25),
    # OpenAI
    "gpt-5.5": _openai(5.0, 30.0, 0.5),
    "gpt-5.4": _openai(2.5, 15.0, 0.25),
    "gpt-5.4-mini": _openai(0.75, 4.5, 0.075),
    "gpt-5.4-nano": _openai(0.2, 1.25, 0.02),
    "gpt-5.2": _openai(1.75, 14.0, 0.175),
    "gpt-5.1": _openai(1.25, 10.0, 0.125),
    "gpt-5": _openai(1.25, 10.0, 0.125),
    "gpt-5-mini": _openai(0.25, 2.0, 0.025),
    "gpt-5-nano": _openai(0.05, 0.4, 0.005),
    "gpt-4.1": _openai(2.0, 8.0, 0.5),
    "gpt-4.1-mini": _openai(0.4, 1.6, 0.1),
    "gpt-4.1-nano": _openai(0.1, 0.4, 0.025),
    "gpt-4o": _openai(2.5, 10.0, 1.25),
    "gpt-4o-mini": _openai(0.15, 0.6, 0.075),
    "o3": _openai(2.0, 8.0, 0.5),
    "o3-mini": _openai(1.1, 4.4, 0.55),
    "o4-mini": _openai(1.1, 4.4, 0.275),
    "o1": _openai(15.0, 60.0, 7.5),
}

# What may follow a known name and still be the same model: a dated snapshot
# (claude-sonnet-4-5-20250929, gpt-4o-2024-08-06, Vertex's @20250929) or "-latest".
# Anything else (claude-opus-4-6 after claude-opus-4) is a different model.
_SNAPSHOT_SUFFIX = re.compile(r"^(?:[-@]\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")

_PRICE_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cache_read_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
)
_REQUIRED_FIELDS = ("input_per_mtok", "output_per_mtok")


class PriceTable:
    """Looks up a model's price: exact name first, then the longest known name it snapshots."""

    def __init__(self, prices: Mapping[str, ModelPrice]) -> None:
        self._prices = {name.lower(): price for name, price in prices.items()}

    @classmethod
    def builtin(cls) -> PriceTable:
        return cls(_BUILTIN_PRICES)

    @classmethod
    def from_yaml(cls, path: Path | str) -> PriceTable:
        """The built-in table with the operator's file merged over it."""
        return cls({**_BUILTIN_PRICES, **_read_price_file(Path(path))})

    def price(self, model: str) -> ModelPrice | None:
        name = model.strip().lower()
        exact = self._prices.get(name)
        if exact is not None:
            return exact
        snapshots_of = [
            known
            for known in self._prices
            if name.startswith(known) and _SNAPSHOT_SUFFIX.match(name[len(known) :])
        ]
        if not snapshots_of:
            return None
        return self._prices[max(snapshots_of, key=len)]

    def cost(
        self,
        model: str,
        input_tokens: int,
        output_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> float | None:
        """USD for one call, or None when the model's price is unknown."""
        price = self.price(model)
        if price is None:
            return None
        return price.cost(
            input_tokens,
            output_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
            cache_write_1h_tokens=cache_write_1h_tokens,
        )

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.price(model) is not None


def _read_price_file(path: Path) -> dict[str, ModelPrice]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"PRICES_FILE {path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigurationError(
            f"PRICES_FILE {path}: not valid YAML: {_yaml_problem(exc)}"
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("models"), dict):
        raise ConfigurationError(
            f"PRICES_FILE {path}: expected a mapping 'models: {{<model>: {{input_per_mtok: .., "
            "output_per_mtok: ..}}}}'"
        )
    return {
        str(name): _parse_price(path, str(name), entry)
        for name, entry in document["models"].items()
    }


def _parse_price(path: Path, name: str, entry: Any) -> ModelPrice:
    where = f"PRICES_FILE {path}: models.{name}"
    if not isinstance(entry, dict):
        raise ConfigurationError(
            f"{where}: expected a mapping of prices, got {type(entry).__name__}"
        )
    unknown = sorted(str(key) for key in entry if key not in _PRICE_FIELDS)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(_PRICE_FIELDS)})"
        )
    for required in _REQUIRED_FIELDS:
        if required not in entry:
            raise ConfigurationError(f"{where}.{required}: missing")
    values: dict[str, float] = {}
    for field_name, value in entry.items():
        if value is None and field_name not in _REQUIRED_FIELDS:
            continue
        values[str(field_name)] = _price_value(f"{where}.{field_name}", value)
    return ModelPrice(**values)


def _price_value(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{where}: expected a number of USD per million tokens, got {value!r}"
        )
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"{where}: must be a finite number >= 0, got {value!r}")
    return float(value)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return str(problem)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
