"""The allow-list check the worker parent runs on a dequeued job before forking (traps 4 and 15).

It reads the raw job hash and decodes the call with ``json`` only, so a
hostile or broken job can neither import nor run anything, and cannot crash
the parent: every outcome is a verdict, never an exception.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis import Redis

_CALLBACK_FIELDS = ("success_callback_name", "failure_callback_name", "stopped_callback_name")
_SHOWN_CHARS = 120


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


def check_job(connection: Redis, job_key: str, allowed_functions: frozenset[str]) -> JobCheck:
    """Decide from the raw hash whether this worker may run the job."""
    raw_data, raw_meta, *callbacks = connection.hmget(job_key, ["data", "meta", *_CALLBACK_FIELDS])
    if raw_data is None:
        return JobCheck(verdict=Verdict.VANISHED, reason="the job hash has no data")
    if not _meta_decodes(raw_meta):
        # rq would load the job anyway (meta = {"unserialized": ...}), run it, and only
        # fail when saving the meta, after the task's effects: refuse it up front.
        return JobCheck(
            verdict=Verdict.UNDECODABLE,
            reason="job meta cannot be decoded: it must be a JSON object"
            " (rq.serializers.JSONSerializer)",
        )
    call = _decode_call(raw_data)
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


def _decode_call(raw_data: bytes | str) -> list[Any] | None:
    if isinstance(raw_data, str):
        raw_data = raw_data.encode()
    try:
        payload = zlib.decompress(raw_data)
    except zlib.error:
        # rq falls back to uncompressed data the same way.
        payload = raw_data
    try:
        call = json.loads(payload)
    except ValueError:
        return None
    if isinstance(call, list) and len(call) == 4:
        return call
    return None


def _meta_decodes(raw_meta: bytes | str | None) -> bool:
    if not raw_meta:
        return True
    try:
        return isinstance(json.loads(raw_meta), dict)
    except ValueError:
        return False


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 3] + "..."
