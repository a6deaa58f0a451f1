"""Every metric with its type, labels and meaning, from the families the worker exports."""

from __future__ import annotations

from worker.dev.docs._markdown import code, table
from worker.metrics import COUNTERS, GAUGES, HISTOGRAMS, POOL_COUNTERS, POOL_GAUGES


def _families() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(name, type, labels, help) of every family, sorted by name."""
    families = [(name, "counter", labels, text) for name, (text, labels) in COUNTERS.items()]
    families += [(name, "gauge", labels, text) for name, (text, labels) in GAUGES.items()]
    families += [
        (name, "histogram", labels, text) for name, (text, labels, _) in HISTOGRAMS.items()
    ]
    families += [(name, "gauge", labels, text) for name, (text, labels) in POOL_GAUGES.items()]
    families += [(name, "counter", labels, text) for name, (text, labels) in POOL_COUNTERS.items()]
    return sorted(families)


def metric_table() -> str:
    rows = [
        (code(name), kind, ", ".join(code(label) for label in labels) or "—", text)
        for name, kind, labels, text in _families()
    ]
    return table(("metric", "type", "labels", "meaning"), rows)


def undocumented_metrics() -> list[str]:
    return [name for name, _, _, text in _families() if not text.strip()]
