"""Every outcome with its effects and meaning, from ``Outcome``."""

from __future__ import annotations

from worker.dev.docs._markdown import code, table
from worker.task import Outcome


def outcome_table() -> str:
    rows = [
        (
            code(outcome.value),
            "failed (never retried)"
            if outcome.never_retried
            else ("failed" if outcome.fails_job else "finished"),
            "yes" if outcome.posts_error else "",
            "yes" if outcome.answers else "",
            outcome.meaning,
        )
        for outcome in Outcome
    ]
    return table(
        ("outcome", "rq job", "posted to `m/agent-errors`", "answer posted", "meaning"), rows
    )


def undocumented_outcomes() -> list[str]:
    return [outcome.value for outcome in Outcome if not outcome.meaning.strip()]
