"""Operator repairs: ``agent-worker requeue`` and ``agent-worker reload-agents``.

``requeue <task_id> ...`` puts failed tasks back on their queue through the one
atomic enqueue, with their original task object and attempt 0. Every id is
checked first; when one is unknown, not failed, or holds an unreadable task,
nothing is requeued (exit 2). The enqueue script takes the task out of the
failed registry, so it is queued exactly once. ``requeue --all`` takes every
task of every failed registry, skips (and lists) those that cannot be
requeued, and exits 2 when it skipped one.

``reload-agents [agent_id ...]`` drops cached agent definitions (all of them
without ids), so every worker reads the files again on its next task.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError
from rq.exceptions import DeserializationError
from rq.queue import Queue
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from worker.agents import AGENT_NAME_PATTERN, AgentStore
from worker.enqueue import (
    DEFAULT_QUEUE,
    DEFAULT_RESULT_TTL_S,
    DEFAULT_TIMEOUT_GRACE_S,
    EnqueueResult,
    enqueue_task,
)
from worker.exceptions import InvalidTask
from worker.operations._job_lookup import fetch_task_job
from worker.operations._redis_option import redis_url_parser, use_redis_url
from worker.operations._session import open_session
from worker.redaction import process_redactor
from worker.redis_io import CappedJob, connect, redis_error_line
from worker.settings import settings_or_exit
from worker.task import Task, parse_task


@dataclass(frozen=True, kw_only=True)
class FailedTask:
    """A task found in a failed registry, ready to be enqueued again."""

    task: Task
    queue_name: str


@dataclass(frozen=True, kw_only=True)
class RequeueOutcome:
    """``requeued`` when every id was put back; ``refusals`` (one line per id) otherwise."""

    requeued: list[EnqueueResult]
    refusals: list[str]


def find_failed_task(redis: Redis, task_id: str) -> FailedTask | str:
    """The failed task ``task_id``, or the reason it cannot be requeued (one line)."""
    job = fetch_task_job(redis, task_id, job_class=CappedJob)
    if isinstance(job, str):
        return job
    registry = FailedJobRegistry(job.origin, connection=redis, serializer=JSONSerializer)
    if task_id not in registry:
        status = job.get_status(refresh=False)
        shown = status.value if status is not None else "unknown"
        return f"{task_id}: not in the failed registry of queue {job.origin} (status {shown})"
    try:
        arguments = job.args
        task = parse_task(arguments[0] if arguments else None)
    except DeserializationError:
        return f"{task_id}: its task cannot be decoded"
    except InvalidTask as exc:
        return f"{task_id}: the stored task is not valid ({exc.message})"
    return FailedTask(task=task, queue_name=job.origin)


def requeue_failed(
    redis: Redis,
    task_ids: list[str],
    *,
    result_ttl_s: int = DEFAULT_RESULT_TTL_S,
    timeout_grace_s: int = DEFAULT_TIMEOUT_GRACE_S,
    skip_refused: bool = False,
) -> RequeueOutcome:
    """Requeue every task of ``task_ids`` from the failed registry, or none of them
    (``skip_refused``: those that can be, listing the others in ``refusals``)."""
    found: list[FailedTask] = []
    refusals: list[str] = []
    for task_id in dict.fromkeys(task_ids):
        answer = find_failed_task(redis, task_id)
        if isinstance(answer, str):
            refusals.append(answer)
        else:
            found.append(answer)
    if refusals and not skip_refused:
        return RequeueOutcome(requeued=[], refusals=refusals)
    requeued = [
        enqueue_task(
            redis,
            failed.task,
            queue_name=failed.queue_name,
            result_ttl_s=result_ttl_s,
            timeout_grace_s=timeout_grace_s,
            attempt=0,
            rerun=True,  # a failed run, put back on purpose
        )
        for failed in found
    ]
    return RequeueOutcome(requeued=requeued, refusals=refusals)


def failed_task_ids(redis: Redis) -> list[str]:
    """Every job id in the failed registry of every queue, oldest failure first."""
    names = {queue.name for queue in Queue.all(connection=redis, serializer=JSONSerializer)}
    task_ids: list[str] = []
    for name in sorted(names | {DEFAULT_QUEUE}):
        registry = FailedJobRegistry(name, connection=redis, serializer=JSONSerializer)
        task_ids.extend(registry.get_job_ids(cleanup=False))
    return task_ids


def requeue_main(argv: list[str]) -> int:
    """``agent-worker requeue TASK_ID [...]``: 0 when all were requeued, 2 when one was refused."""
    parser = argparse.ArgumentParser(
        prog="agent-worker requeue",
        description="Put failed tasks back on their queue (attempt 0); all or none.",
        parents=[redis_url_parser()],
    )
    parser.add_argument(
        "task_ids", nargs="*", metavar="TASK_ID", help="failed tasks to put back (all or none)"
    )
    parser.add_argument(
        "--all", action="store_true", help="every failed task (skipping those that cannot be)"
    )
    args = parser.parse_args(argv)
    if bool(args.task_ids) == args.all:
        parser.error("give task ids or --all (not both)")
    session = open_session(args.redis_url)
    redis, settings = session.redis, session.settings
    try:
        outcome = requeue_failed(
            redis,
            failed_task_ids(redis) if args.all else args.task_ids,
            result_ttl_s=settings.result_ttl_s,
            timeout_grace_s=settings.job_timeout_grace_s,
            skip_refused=args.all,
        )
    except RedisError as exc:
        print(f"agent-worker requeue: {session.redact(redis_error_line(exc))}", file=sys.stderr)
        return 1
    finally:
        redis.close()
    for result in outcome.requeued:
        # "duplicate" would mean another requeue of the same task got there first.
        word = "requeued" if result.enqueued else result.status
        print(f"{word} {result.task_id}")
    if outcome.refusals:
        for refusal in outcome.refusals:
            print(f"agent-worker requeue: {refusal}", file=sys.stderr)
        if not args.all:
            print("agent-worker requeue: nothing was requeued", file=sys.stderr)
        return 2
    if args.all and not outcome.requeued:
        print("no failed tasks")
    return 0


def reload_agents_main(argv: list[str]) -> int:
    """``agent-worker reload-agents [AGENT_ID ...]``: drop cached definitions, say how many."""
    parser = argparse.ArgumentParser(
        prog="agent-worker reload-agents",
        description="Drop cached agent definitions (all without ids); workers re-read the files.",
        parents=[redis_url_parser()],
    )
    parser.add_argument(
        "agent_ids", nargs="*", metavar="AGENT_ID", help="agents whose cache to drop (none: all)"
    )
    args = parser.parse_args(argv)
    use_redis_url(args.redis_url)
    malformed = [name for name in args.agent_ids if not re.fullmatch(AGENT_NAME_PATTERN, name)]
    if malformed:
        for name in malformed:
            print(
                f"agent-worker reload-agents: {name!r} is not an agent id "
                "(3-50 characters of a-z, 0-9 and '-')",
                file=sys.stderr,
            )
        return 2
    settings = settings_or_exit()
    redis = connect(settings)
    store = AgentStore(settings.agents_dir, redis=redis, ttl_s=settings.agent_cache_ttl_s)
    try:
        if args.agent_ids:
            dropped = sum(store.invalidate(agent_id) for agent_id in dict.fromkeys(args.agent_ids))
        else:
            dropped = store.invalidate()
    except RedisError as exc:
        print(f"agent-worker reload-agents: {_redacted(exc)}", file=sys.stderr)
        return 1
    finally:
        store.close()
        redis.close()
    noun = "definition" if dropped == 1 else "definitions"
    print(f"dropped {dropped} cached agent {noun}")
    return 0


def _redacted(exc: RedisError) -> str:
    return process_redactor(settings_or_exit().secret_values()).redact(redis_error_line(exc))
