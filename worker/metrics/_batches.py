"""A batch of metric increments: the JSON that carries them from where they were recorded
(a job process, through Redis; a pooled worker, through its pipe) to the metrics served.

    {"counters":     [[name, [label, ...], amount], ...],
     "observations": [[name, [label, ...], [value, ...]], ...],
     "exemplars":    [[name, [label, ...], trace_id], ...]}

``Increments`` gathers one (``JobMetrics`` holds it); ``entries`` and ``exemplars`` read
one back, skipping what breaks the format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

LabelKey = tuple[str, tuple[str, ...]]

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class Increments:
    """Counts, observations and the trace of an observation (its exemplar), by series."""

    counts: dict[LabelKey, float] = field(default_factory=dict)
    observations: dict[LabelKey, list[float]] = field(default_factory=dict)
    exemplars: dict[LabelKey, str] = field(default_factory=dict)

    def count(self, name: str, labels: tuple[str, ...], amount: float = 1) -> None:
        key = (name, labels)
        self.counts[key] = self.counts.get(key, 0) + amount

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        self.observations.setdefault((name, labels), []).append(value)

    def batch(self) -> dict[str, Any] | None:
        """The batch of these increments; None when there is nothing to send."""
        if not self.counts and not self.observations:
            return None
        return {
            "counters": [
                [name, list(labels), value] for (name, labels), value in self.counts.items()
            ],
            "observations": [
                [name, list(labels), values] for (name, labels), values in self.observations.items()
            ],
            "exemplars": [
                [name, list(labels), trace_id]
                for (name, labels), trace_id in self.exemplars.items()
            ],
        }

    def add_batch(self, batch: dict[str, Any]) -> None:
        """Take back a batch built here that could not be sent."""
        for name, labels, value in batch["counters"]:
            self.count(name, tuple(labels), value)
        for name, labels, values in batch["observations"]:
            self.observations.setdefault((name, tuple(labels)), []).extend(values)
        for name, labels, trace_id in batch["exemplars"]:
            self.exemplars.setdefault((name, tuple(labels)), trace_id)


def entries(raw: Any) -> list[tuple[str, tuple[str, ...], Any]]:
    """The well-formed ``[name, [labels], value]`` entries of one list of a batch."""
    if not isinstance(raw, list):
        return []
    found = []
    for entry in raw:
        if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[1], list):
            found.append((str(entry[0]), tuple(str(label) for label in entry[1]), entry[2]))
    return found


def exemplars(batch: Any) -> dict[LabelKey, str]:
    """The trace id of each series' last observation, where it is a trace id."""
    return {
        (name, labels): trace_id
        for name, labels, trace_id in entries(batch.get("exemplars"))
        if isinstance(trace_id, str) and _TRACE_ID.fullmatch(trace_id)
    }
