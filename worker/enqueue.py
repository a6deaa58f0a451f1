"""Putting tasks on the queue: the one atomic enqueue every producer shares (docs/contract.md).

``enqueue_task`` writes the rq job hash exactly as rq 3.0 would for a job of
``worker.jobs.run_task`` with the JSON serializer, in one Lua script
(``enqueue.lua``) that skips a task id which is already queued, scheduled or
running. The CLI (``agent-worker enqueue``), the worker's own requeues and
non-Python Hubs (through the JSON Schemas shipped in ``worker/schemas``) all
go through the same script.
"""

from __future__ import annotations

import json
import math
import sys
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from weakref import WeakKeyDictionary

from pydantic import ValidationError
from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import (
    CanceledJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
)
from rq.serializers import JSONSerializer
from rq.utils import now, utcformat

from worker.exceptions import ConfigurationError
from worker.redis_io import redis_error_line
from worker.task import AgentReport, Task, describe_validation_error, parse_task
from worker.tracing import attached, configure_tracing, environment_context, publishing

JOB_FUNCTION = "worker.jobs.run_task"
DEFAULT_QUEUE = "agents"
DEFAULT_MAX_DURATION_S = 300.0
DEFAULT_RESULT_TTL_S = 7 * 86_400
DEFAULT_TIMEOUT_GRACE_S = 60

EnqueueStatus = Literal["enqueued", "duplicate", "scheduled"]
# The job meta key that says why the worker put a task back (status and report show it).
REQUEUE_REASON = "requeue_reason"


@dataclass(frozen=True, kw_only=True)
class EnqueueResult:
    task_id: str
    enqueued: bool
    status: EnqueueStatus
    # A duplicate because the task already ran (its result is kept): ``rerun`` runs it again.
    already_ran: bool = False


_SCRIPT_SOURCE = resources.files("worker").joinpath("enqueue.lua").read_text(encoding="utf-8")
_scripts: WeakKeyDictionary[Redis, Script] = WeakKeyDictionary()
_STATUS_BY_SCRIPT_RESULT: dict[int, EnqueueStatus] = {
    0: "duplicate",
    1: "enqueued",
    2: "scheduled",
    3: "duplicate",  # it already ran
}
_ALREADY_RAN = 3


def job_timeout_s(task: Task, timeout_grace_s: float = DEFAULT_TIMEOUT_GRACE_S) -> int:
    """rq's hard timeout for a task: its deadline (constraint, else the default) plus a grace.

    rq's timeout is only a backstop: the loop enforces the deadline itself and
    needs the grace to wind down, report and post.
    """
    deadline_s = task.constraints.max_duration_s or DEFAULT_MAX_DURATION_S
    return math.ceil(deadline_s + timeout_grace_s)


def enqueue_task(
    redis: Redis,
    task: Task | Mapping[str, Any],
    *,
    queue_name: str = DEFAULT_QUEUE,
    result_ttl_s: int = DEFAULT_RESULT_TTL_S,
    timeout_grace_s: int = DEFAULT_TIMEOUT_GRACE_S,
    delay_s: float = 0,
    attempt: int = 0,
    rerun: bool = False,
    requeue_reason: str | None = None,
) -> EnqueueResult:
    """Enqueue one task, or do nothing when its id is already queued, scheduled or running,
    or already ran while its job (and report) is kept: ``rerun=True`` runs it again, its
    new report replacing the old one. ``requeue_reason`` (the worker's own delayed requeues)
    is kept in the job's meta, for ``agent-worker status`` and ``report`` to show.

    A ``priority: high`` task goes to the front of the queue. With ``delay_s``
    the task waits in rq's scheduled registry until rq's scheduler (run by
    every AgentWorker) moves it to the queue. Raises InvalidTask for a mapping
    that is not a valid task.
    """
    valid_task = task if isinstance(task, Task) else parse_task(dict(task))
    return _enqueue_call(
        redis,
        valid_task,
        function_name=JOB_FUNCTION,
        queue_name=queue_name,
        result_ttl_s=result_ttl_s,
        timeout_grace_s=timeout_grace_s,
        delay_s=delay_s,
        attempt=attempt,
        rerun=rerun,
        requeue_reason=requeue_reason,
    )


def _enqueue_call(
    redis: Redis,
    task: Task,
    *,
    function_name: str,
    queue_name: str,
    result_ttl_s: int,
    timeout_grace_s: int,
    delay_s: float,
    attempt: int,
    rerun: bool = False,
    requeue_reason: str | None = None,
) -> EnqueueResult:
    """The atomic write itself; tests name their own job function to run it end to end."""
    scheduled = delay_s > 0
    task_wire = task.model_dump(mode="json", exclude_none=True)
    with publishing(task_wire, queue_name):  # the producer's trace context rides in the task
        fields = _job_hash(
            task,
            task_wire,
            function_name=function_name,
            queue_name=queue_name,
            result_ttl_s=result_ttl_s,
            timeout_grace_s=timeout_grace_s,
            scheduled=scheduled,
            attempt=attempt,
            requeue_reason=requeue_reason,
        )
        return _run_script(
            redis,
            task,
            fields,
            queue_name=queue_name,
            scheduled=scheduled,
            delay_s=delay_s,
            rerun=rerun,
        )


def _run_script(
    redis: Redis,
    task: Task,
    fields: dict[str, str | bytes | int],
    *,
    queue_name: str,
    scheduled: bool,
    delay_s: float,
    rerun: bool,
) -> EnqueueResult:
    placement = "scheduled" if scheduled else "front" if task.priority == "high" else "back"
    due_at = math.ceil(time.time() + delay_s) if scheduled else 0
    queue_key = Queue.redis_queue_namespace_prefix + queue_name
    keys = [
        Job.key_for(task.task_id),
        queue_key,
        Queue.redis_queues_keys,
        ScheduledJobRegistry.key_template.format(queue_name),
        FinishedJobRegistry.key_template.format(queue_name),
        FailedJobRegistry.key_template.format(queue_name),
        CanceledJobRegistry.key_template.format(queue_name),
    ]
    args: list[str | bytes | int] = [
        task.task_id,
        placement,
        due_at,
        queue_key,
        "rerun" if rerun else "",
    ]
    for name, value in fields.items():
        args.extend((name, value))
    outcome = int(_script_for(redis)(keys=keys, args=args))
    status = _STATUS_BY_SCRIPT_RESULT[outcome]
    return EnqueueResult(
        task_id=task.task_id,
        enqueued=status != "duplicate",
        status=status,
        already_ran=outcome == _ALREADY_RAN,
    )


def _script_for(redis: Redis) -> Script:
    script = _scripts.get(redis)
    if script is None:
        script = redis.register_script(_SCRIPT_SOURCE)
        _scripts[redis] = script
    return script


def _job_hash(
    task: Task,
    task_wire: dict[str, Any],
    *,
    function_name: str,
    queue_name: str,
    result_ttl_s: int,
    timeout_grace_s: int,
    scheduled: bool,
    attempt: int,
    requeue_reason: str | None = None,
) -> dict[str, str | bytes | int]:
    """The fields rq 3.0's ``Job.to_dict()`` writes for this job, byte for byte."""
    call: tuple[str, None, list[dict[str, Any]], dict[str, Any]] = (
        function_name,
        None,
        [task_wire],
        {},
    )
    timestamp = utcformat(now())
    fields: dict[str, str | bytes | int] = {
        "created_at": timestamp,
        "data": zlib.compress(_json_bytes(call)),
        "success_callback_name": "",
        "failure_callback_name": "",
        "stopped_callback_name": "",
        "started_at": "",
        "ended_at": "",
        "last_heartbeat": "",
        "worker_name": "",
        "group_id": "",
        "origin": queue_name,
        "description": f"{task.type.value} task {task.task_id} for {task.agent_id}",
        "timeout": job_timeout_s(task, timeout_grace_s),
        "result_ttl": result_ttl_s,
        "status": (JobStatus.SCHEDULED if scheduled else JobStatus.QUEUED).value,
        "meta": _json_bytes(
            {"attempt": attempt, **({REQUEUE_REASON: requeue_reason} if requeue_reason else {})}
        ),
    }
    if scheduled:
        # rq's scheduler reads this to push a due high-priority job to the front.
        if task.priority == "high":
            fields["enqueue_at_front"] = 1
    else:
        fields["enqueued_at"] = timestamp
    return fields


def _json_bytes(value: Any) -> bytes:
    encoded: bytes = JSONSerializer.dumps(value)  # type: ignore[no-untyped-call]
    return encoded


def parse_task_input(text: str) -> tuple[list[Task], list[str]]:
    """Read tasks from one JSON object, a JSON array, or JSON lines.

    Returns the valid tasks and one problem line per invalid entry, in input
    order, such as ``line 3: post_id is required for notification tasks``. Use
    it to validate everything before enqueueing anything.
    """
    entries, problems = _split_entries(text)
    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for where, raw in entries:
        if isinstance(raw, _NotJson):
            problems.append(f"{where}: not valid JSON ({raw.reason})")
            continue
        if not isinstance(raw, dict):
            problems.append(f"{where}: expected a JSON object, got {_json_type(raw)}")
            continue
        try:
            task = Task.model_validate(raw)
        except ValidationError as exc:
            problems.append(f"{where}: {_readable(exc)}")
            continue
        if task.task_id in first_seen:
            problems.append(
                f"{where}: task_id {task.task_id} appears more than once"
                f" (first at {first_seen[task.task_id]})"
            )
            continue
        first_seen[task.task_id] = where
        tasks.append(task)
    return tasks, problems


@dataclass(frozen=True)
class _NotJson:
    reason: str


def _split_entries(text: str) -> tuple[list[tuple[str, Any]], list[str]]:
    if not text.strip():
        return [], ["input is empty: expected a JSON object, a JSON array or JSON lines"]
    try:
        document: Any = json.loads(text)
    except ValueError:
        return _json_lines(text), []
    if isinstance(document, dict):
        return [("task", document)], []
    if isinstance(document, list):
        return [(f"item {number}", raw) for number, raw in enumerate(document, start=1)], []
    return [], [f"input is a JSON {_json_type(document)}: expected an object, array or lines"]


def _json_lines(text: str) -> list[tuple[str, Any]]:
    entries: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append((f"line {number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            entries.append((f"line {number}", _NotJson(f"{exc.msg} at column {exc.colno}")))
    return entries


def _readable(exc: ValidationError) -> str:
    # A rule on the whole task (post_id for notifications) reads better without "task: ".
    parts = describe_validation_error(exc).split("; ")
    return "; ".join(part.removeprefix("task: ") for part in parts)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def enqueue_cli(
    source: str,
    redis: Redis,
    *,
    queue_name: str = DEFAULT_QUEUE,
    result_ttl_s: int = DEFAULT_RESULT_TTL_S,
    timeout_grace_s: int = DEFAULT_TIMEOUT_GRACE_S,
    rerun: bool = False,
) -> int:
    """``agent-worker enqueue [--rerun] FILE|-``: validate every task, then enqueue them all.

    Prints ``enqueued <id>`` or ``duplicate <id>`` per task (with why, for a task that
    already ran) and returns 0; on
    invalid input prints one problem per line on stderr, enqueues nothing and
    returns 2; returns 1 when Redis cannot be reached.
    """
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        print(f"agent-worker enqueue: cannot read {source}: {reason}", file=sys.stderr)
        return 2
    tasks, problems = parse_task_input(text)
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2
    try:
        # With OTEL_* set, each task's publish span, child of TRACEPARENT when given.
        configure_tracing("agent-worker-enqueue")
    except ConfigurationError as exc:
        print(f"agent-worker enqueue: {exc.message}", file=sys.stderr)
        return 2
    try:
        with attached(environment_context()):
            for task in tasks:
                result = enqueue_task(
                    redis,
                    task,
                    queue_name=queue_name,
                    result_ttl_s=result_ttl_s,
                    timeout_grace_s=timeout_grace_s,
                    rerun=rerun,
                )
                hint = " (it already ran; --rerun runs it again)" if result.already_ran else ""
                print(f"{result.status} {result.task_id}{hint}", flush=True)
    except RedisError as exc:
        print(f"agent-worker enqueue: {redis_error_line(exc)}", file=sys.stderr)
        return 1
    return 0


SCHEMA_DIR = Path(__file__).parent / "schemas"
TASK_SCHEMA_FILE = "task.schema.json"
REPORT_SCHEMA_FILE = "agent-report.schema.json"
_JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def current_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schemas of Task (what the Hub writes) and AgentReport (what it reads back)."""
    task_schema = Task.model_json_schema(mode="validation")
    # Task checks this rule in Python (a model validator); spell it out for other languages.
    task_schema["if"] = {"properties": {"type": {"const": "notification"}}, "required": ["type"]}
    task_schema["then"] = {
        "required": ["post_id"],
        "properties": {"post_id": {"type": "string", "minLength": 1}},
    }
    report_schema = AgentReport.model_json_schema(mode="serialization", by_alias=True)
    return {
        TASK_SCHEMA_FILE: {"$schema": _JSON_SCHEMA_DIALECT, **task_schema},
        REPORT_SCHEMA_FILE: {"$schema": _JSON_SCHEMA_DIALECT, **report_schema},
    }


def schema_files() -> dict[str, Path]:
    """The shipped schema files, by file name, for a non-Python Hub to validate against."""
    return {name: SCHEMA_DIR / name for name in (TASK_SCHEMA_FILE, REPORT_SCHEMA_FILE)}


def write_schemas(directory: Path) -> list[Path]:
    """Regenerate the schema files from the models (run after changing Task or AgentReport)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in current_schemas().items():
        path = directory / name
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written
