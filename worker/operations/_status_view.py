"""``agent-worker status``: the fleet's ``FleetStatus`` as tables, or as JSON with ``--json``.

The JSON schema is documented with the reading itself, in ``_status``.
"""

from __future__ import annotations

import argparse
import json
import sys

from redis.exceptions import RedisError

from worker.operations._redis_option import redis_url_parser
from worker.operations._session import open_session
from worker.operations._status import (
    DEFAULT_FAILURES_SHOWN,
    STATES,
    FleetStatus,
    WorkerInfo,
    collect_status,
)
from worker.redis_io import redis_error_line

# The table keeps one line per failure; --json has the whole text.
_TABLE_ERROR_CHARS = 100


def render_table(status: FleetStatus) -> str:
    """The human view: one table per section."""
    queue_rows: list[list[object]] = [
        [q.name, q.queued, q.started, q.scheduled, q.deferred, q.finished, q.failed, q.canceled]
        for q in status.queues
    ]
    sections = [
        _table(["QUEUE", *(state.upper() for state in STATES)], queue_rows),
        f"WORKERS ({len(status.workers)})",
    ]
    if status.workers:
        sections.append(
            _table(
                ["NAME", "HOST:PID", "STATE", "TASK", "AGENT", "TYPE", "ELAPSED", "STEP"],
                [_worker_row(worker) for worker in status.workers],
            )
        )
    sections.append(f"RECENT FAILURES ({len(status.recent_failures)})")
    if status.recent_failures:
        sections.append(
            _table(
                ["TASK", "AGENT", "OUTCOME", "FAILED AT", "ERROR"],
                [
                    [
                        f.task_id,
                        f.agent_id or "-",
                        f.outcome or "-",
                        _short_time(f.failed_at),
                        _shorten(f.error or "-", _TABLE_ERROR_CHARS),
                    ]
                    for f in status.recent_failures
                ],
            )
        )
    if status.requeued:
        sections.append(f"REQUEUED ({len(status.requeued)})")
        sections.append(
            _table(
                ["TASK", "AGENT", "ATTEMPT", "NEXT TRY", "REASON"],
                [
                    [
                        r.task_id,
                        r.agent_id or "-",
                        r.attempt,
                        _short_time(r.next_try_at) if r.next_try_at else "due",
                        _shorten(r.reason, _TABLE_ERROR_CHARS),
                    ]
                    for r in status.requeued
                ],
            )
        )
    sections.append(f"OUTBOX  pending {status.outbox.pending}  dead {status.outbox.dead}")
    newest = status.outbox.newest_dead
    if newest is not None:
        sections[-1] += (
            f"\n  newest dead letter {newest['id']} ({newest['kind']}, "
            f"{_short_time(newest['dead_at'])}): {_shorten(newest['error'], _TABLE_ERROR_CHARS)}"
            "\n  replay or drop with: agent-worker dead-letters replay|drop ID"
        )
    return "\n\n".join(sections)


def _worker_row(worker: WorkerInfo) -> list[object]:
    where = f"{worker.hostname or '?'}:{worker.pid or '?'}"
    job = worker.current_job
    if job is None:
        return [worker.name, where, worker.state, "-", "-", "-", "-", "-"]
    elapsed = f"{job.elapsed_s:.0f}s" if job.elapsed_s is not None else "-"
    return [
        worker.name,
        where,
        worker.state,
        job.task_id,
        job.agent_id or "-",
        job.type or "-",
        elapsed,
        job.step,
    ]


def _table(header: list[str], rows: list[list[object]]) -> str:
    cells = [header, *[[str(value) for value in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    lines = [
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True))
        for row in cells
    ]
    return "\n".join(line.rstrip() for line in lines)


def _short_time(iso: str | None) -> str:
    return f"{iso[:10]} {iso[11:19]}Z" if iso else "-"


def _shorten(text: str, limit: int) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-worker status",
        description="Queues, workers, recent failures and the outbox, read from Redis.",
        parents=[redis_url_parser()],
    )
    parser.add_argument("--json", action="store_true", help="print the documented JSON object")
    parser.add_argument(
        "--failures",
        type=int,
        default=DEFAULT_FAILURES_SHOWN,
        metavar="N",
        help="show the N newest failures (default %(default)s)",
    )
    return parser


def main(argv: list[str]) -> int:
    """``agent-worker status [--json] [--failures N]``."""
    args = _parser().parse_args(argv)
    session = open_session(args.redis_url)
    redis, redact = session.redis, session.redact
    try:
        status = collect_status(redis, failures_shown=max(0, args.failures), redact=redact)
    except RedisError as exc:
        print(f"agent-worker status: {redact(redis_error_line(exc))}", file=sys.stderr)
        return 1
    finally:
        redis.close()
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        print(render_table(status))
    return 0
