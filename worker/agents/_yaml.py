"""YAML from definition files, bounded before it is built.

A definition is hostile input: 200 KB of nested ``[`` can crash a YAML composer that
recurses, and a 500-byte alias bomb expands to hundreds of megabytes once pydantic,
JSON or a model prompt walks it. So the event stream (the parser is a state machine:
it does not recurse) is scanned first, counting nesting depth and every value as it
will be once aliases are expanded; only a document within both limits is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from worker.exceptions import AgentConfigError

# The C loader parses a config several times faster; the pure one is the fallback.
_YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_COLLECTION_START = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_COLLECTION_END = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


@dataclass(frozen=True, slots=True, kw_only=True)
class YamlLimits:
    """How big a definition's YAML may be. A real config nests 5 levels and holds a few
    hundred values; these leave room for long keyword lists, not for attacks."""

    max_depth: int = 20
    # Scalars and collections, each alias counted as everything it stands for.
    max_values: int = 20_000

    def check_depth(self, depth: int, file: str, line: int) -> None:
        if depth > self.max_depth:
            raise AgentConfigError(
                f"{file}: nested deeper than {self.max_depth} levels (line {line})"
            )

    def check_values(self, values: int, file: str) -> None:
        if values > self.max_values:
            raise AgentConfigError(
                f"{file}: more than {self.max_values} YAML values once aliases are "
                f"expanded ({values} so far)"
            )


DEFAULT_YAML_LIMITS = YamlLimits()


@dataclass(slots=True)
class _Scan:
    """Running totals of one scan: values so far (aliases expanded), open collections."""

    values: int = 0
    # One entry per open collection: (anchor or None, values before it opened).
    open_collections: list[tuple[str | None, int]] = field(default_factory=list)
    # Anchor → how many values an alias to it stands for.
    anchored_sizes: dict[str, int] = field(default_factory=dict)


def load_yaml(
    text: str, file: str, *, first_line: int = 1, limits: YamlLimits = DEFAULT_YAML_LIMITS
) -> Any:
    """The document in ``text``, or AgentConfigError naming ``file`` (and the line)."""
    try:
        _check_shape(text, file, first_line, limits)
        return yaml.load(text, Loader=_YamlLoader)  # a safe loader: no Python objects
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{file}: {_describe_yaml_error(exc, first_line)}") from None
    except RecursionError:
        # Only reachable if a loader recursed below our depth limit; never a crash.
        raise AgentConfigError(f"{file}: nested too deeply to parse") from None


def _check_shape(text: str, file: str, first_line: int, limits: YamlLimits) -> None:
    scan = _Scan()
    for event in yaml.parse(text, Loader=_YamlLoader):
        if isinstance(event, yaml.AliasEvent):
            scan.values += scan.anchored_sizes.get(str(event.anchor), 1)
        elif isinstance(event, _COLLECTION_START):
            scan.open_collections.append((event.anchor, scan.values))
            scan.values += 1
            line = event.start_mark.line + first_line if event.start_mark else first_line
            limits.check_depth(len(scan.open_collections), file, line)
        elif isinstance(event, _COLLECTION_END):
            anchor, before = scan.open_collections.pop()
            if anchor is not None:
                scan.anchored_sizes[anchor] = scan.values - before
        elif isinstance(event, yaml.ScalarEvent):
            scan.values += 1
            if event.anchor is not None:
                scan.anchored_sizes[event.anchor] = 1
        else:
            continue
        limits.check_values(scan.values, file)


def _describe_yaml_error(exc: yaml.YAMLError, first_line: int) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "not valid YAML"
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + first_line}, column {mark.column + 1}: {problem}"
