"""The allow-list check the worker parent runs on a dequeued job before forking (traps 4 and 15).

It reads the raw job hash and decodes the call with ``json`` only, so a
hostile or broken job can neither import nor run anything, and cannot crash
the parent: every outcome is a verdict, never an exception. Job data is decompressed
with a size cap before anything decodes it (``worker.redis_io``'s ``decompress_capped``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis import Redis

from worker.redis_io import (
    DEFAULT_MAX_JOB_DATA_BYTES,
    JobDataTooLarge,
    decompress_capped,
    job_attempt,
)

_CALLBACK_FIELDS = ("success_callback_name", "failure_callback_name", "stopped_callback_name")
_SHOWN_CHARS = 120
# Set only by the job itself during its run; a producer's value would steer the worker.
JOB_CONTROL_FIELDS = ("requeue", "report")


class Verdict(StrEnum):
    RUNNABLE = "runnable"
    REFUSED = "refused"  # a function (or callback) outside the allow-list
    UNDECODABLE = "undecodable"  # not a JSON call rq could run
    VANISHED = "vanished"  # the hash is gone (deleted, or lost in a Redis restart)


@dataclass(frozen=True, kw_only=True)
class JobCheck:
    verdict: Verdict
    reason: str = ""
    # The first positional argument when it is an object: the task of worker.jobs.run_task.
    task: dict[str, Any] | None = None
    # The allowed function the job calls (set for runnable jobs only).
    function: str | None = None


def check_job(
    connection: Redis,
    job_key: str,
    allowed_functions: frozenset[str],
    *,
    max_data_bytes: int = DEFAULT_MAX_JOB_DATA_BYTES,
) -> JobCheck:
    """Decide from the raw hash whether this worker may run the job."""
    raw_data, raw_meta, *callbacks = connection.hmget(job_key, ["data", "meta", *_CALLBACK_FIELDS])
    if raw_data is None:
        return JobCheck(verdict=Verdict.VANISHED, reason="the job hash has no data")
    meta_problem = _meta_problem(raw_meta)
    if meta_problem is not None:
        # rq would load the job anyway (meta = {"unserialized": ...}), run it, and only
        # fail when saving the meta, after the task's effects: refuse it up front.
        return JobCheck(verdict=Verdict.UNDECODABLE, reason=meta_problem)
    try:
        call = _decode_call(raw_data, max_data_bytes)
    except JobDataTooLarge as exc:
        return JobCheck(verdict=Verdict.UNDECODABLE, reason=f"job data refused: {exc}")
    if call is None:
        return JobCheck(
            verdict=Verdict.UNDECODABLE,
            reason="job data cannot be decoded: this worker reads only jobs written"
            " with rq.serializers.JSONSerializer as [function, null, args, kwargs]",
        )
    func_name, instance, args, kwargs = call
    if not isinstance(func_name, str) or func_name not in allowed_functions:
        allowed = ", ".join(sorted(allowed_functions))
        return JobCheck(
            verdict=Verdict.REFUSED,
            reason=f"job function {_shown(func_name)} is not allowed;"
            f" this worker runs only {allowed}",
        )
    if instance is not None:
        return JobCheck(verdict=Verdict.REFUSED, reason="job instance methods are not allowed")
    for field, value in zip(_CALLBACK_FIELDS, callbacks, strict=True):
        if value:
            return JobCheck(
                verdict=Verdict.REFUSED,
                reason=f"job {field} {_shown(_text(value))} is not allowed; this worker runs no"
                " rq callbacks",
            )
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return JobCheck(
            verdict=Verdict.UNDECODABLE,
            reason="job arguments cannot be decoded: args must be a list and kwargs an object",
        )
    task = args[0] if len(args) == 1 and isinstance(args[0], dict) and not kwargs else None
    return JobCheck(verdict=Verdict.RUNNABLE, task=task, function=func_name)


def _decode_call(raw_data: bytes | str, max_data_bytes: int) -> list[Any] | None:
    payload = decompress_capped(raw_data, max_data_bytes)
    try:
        call = json.loads(payload)
    except ValueError:
        return None
    if isinstance(call, list) and len(call) == 4:
        return call
    return None


def _meta_problem(raw_meta: bytes | str | None) -> str | None:
    """What is wrong with the job's meta, or None when it is fine (or absent)."""
    if not raw_meta:
        return None
    try:
        meta = json.loads(raw_meta)
    except (ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        return (
            "job meta cannot be decoded: it must be a JSON object (rq.serializers.JSONSerializer)"
        )
    try:
        job_attempt(meta)
    except ValueError as exc:
        return str(exc)
    return None


def producer_control_fields(raw_meta: bytes | str | None) -> dict[str, Any] | None:
    """The meta without the job's own control fields, or None when it holds none of them.

    ``requeue`` and ``report`` are written by a task during its run; one found at
    the start came from whoever wrote the job hash, and must not steer the worker.
    """
    if not raw_meta:
        return None
    try:
        meta = json.loads(raw_meta)
    except (ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or not any(field in meta for field in JOB_CONTROL_FIELDS):
        return None
    return {key: value for key, value in meta.items() if key not in JOB_CONTROL_FIELDS}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 3] + "..."
