"""``agent-worker report TASK_ID [--json]``: the AgentReport of a task that ran.

The report is what the task left in ``job.meta["report"]``: readable text by
default (with the trace id of the run when it was traced), the report object itself
with ``--json``. Exit 0 with a report, 2 when
the id is malformed, unknown (never enqueued, or expired after ``RESULT_TTL_S``)
or the task has no report yet (still queued or running), 1 when Redis cannot be
reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from worker.operations._job_lookup import fetch_task_job, requeue_note
from worker.operations._redis_option import redis_url_parser
from worker.operations._session import open_session
from worker.redis_io import CappedJob, redis_error_line


@dataclass(frozen=True, kw_only=True)
class StoredReport:
    """A task's AgentReport and where its rq job stands."""

    report: dict[str, Any]
    job_status: str
    ended_at: str | None
    # The OpenTelemetry trace of the run that wrote the report, when it was traced.
    trace_id: str | None = None


def find_report(redis: Redis, task_id: str) -> StoredReport | str:
    """The task's report, or one line saying why there is none."""
    job = fetch_task_job(redis, task_id, job_class=CappedJob)
    if isinstance(job, str):
        return job
    status = job.get_status(refresh=False)
    shown_status = status.value if status is not None else "unknown"
    report = job.meta.get("report")
    if not isinstance(report, dict):
        note = requeue_note(redis, job)
        if note is not None:
            when = f"next try at {note.next_try_at}" if note.next_try_at else "due now"
            return (
                f"{task_id}: no report yet (status {shown_status}): requeued for attempt "
                f"{note.attempt}, {when}: {note.reason}"
            )
        return f"{task_id}: no report yet (status {shown_status})"
    ended_at = job.ended_at.isoformat(timespec="seconds") if job.ended_at else None
    trace_id = job.meta.get("trace_id")
    return StoredReport(
        report=report,
        job_status=shown_status,
        ended_at=ended_at,
        trace_id=trace_id if isinstance(trace_id, str) else None,
    )


def render_report(stored: StoredReport) -> str:
    """The readable view: what ran, how it ended, what it cost, what it said."""
    report = stored.report
    ended = f", ended {stored.ended_at}" if stored.ended_at else ""
    cost = report.get("cost_usd")
    lines = [
        f"task {report.get('task_id')} ({report.get('type')}, agent {report.get('agent_id')}): "
        f"{report.get('outcome')}",
        f"  rq job: {stored.job_status}{ended}",
        f"  iterations {report.get('iterations')}, llm calls {report.get('llm_calls')}, "
        f"tool calls {report.get('tool_calls')}",
        f"  tokens {report.get('tokens_input')} in / {report.get('tokens_output')} out "
        f"({report.get('tokens_cache_read', 0)} in read from the prompt cache, "
        f"{report.get('tokens_cache_write', 0)} written to it), "
        f"cost {'unknown' if cost is None else f'${cost:.4f}'}, "
        f"{report.get('duration_s')} s",
        f"  posted: {', '.join(map(str, report.get('posted') or [])) or 'nothing'}",
    ]
    if stored.trace_id:
        lines.append(f"  trace: {stored.trace_id}")
    error = report.get("error")
    if isinstance(error, dict):
        lines.append(f"  error: {error.get('class')}: {error.get('message')}")
    output = str(report.get("output") or "").strip()
    lines.append("output:" if output else "output: (none)")
    if output:
        lines.append(textwrap.indent(output, "  "))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``agent-worker report TASK_ID [--json]``."""
    parser = argparse.ArgumentParser(
        prog="agent-worker report",
        description="Show the AgentReport of a task that ran.",
        parents=[redis_url_parser()],
    )
    parser.add_argument("task_id", metavar="TASK_ID", help="the task whose report to show")
    parser.add_argument("--json", action="store_true", help="print the report object")
    args = parser.parse_args(argv)
    session = open_session(args.redis_url)
    redis, redact = session.redis, session.redact
    try:
        found = find_report(redis, args.task_id)
    except RedisError as exc:
        print(f"agent-worker report: {redact(redis_error_line(exc))}", file=sys.stderr)
        return 1
    finally:
        redis.close()
    if isinstance(found, str):
        print(f"agent-worker report: {found}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(found.report, indent=2))
    else:
        print(render_report(found))
    return 0
