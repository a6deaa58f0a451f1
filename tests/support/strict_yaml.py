"""Shipped YAML read the way Docker Compose, kubectl and Prometheus read it: a key given
twice in one mapping is an error (PyYAML's ``safe_load`` keeps the last one silently), and
a file of several documents is read whole (``safe_load`` refuses it, ``safe_load_all`` is
needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping names one key twice."""


class StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: keys written here may override merged ones
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if key in seen:
                raise DuplicateKey(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found the key {key!r} a second time (first on line "
                    f"{seen[key].start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_documents(path: Path) -> list[Any]:
    """Every document of ``path``; raises DuplicateKey (a YAMLError) for a repeated key."""
    return list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=StrictLoader))


def load_document(path: Path) -> Any:
    """The one document of ``path``; a second document is an error, not ignored."""
    (document,) = load_documents(path)
    return document
