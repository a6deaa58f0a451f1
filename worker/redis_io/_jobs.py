"""rq jobs loaded with their data capped, and the attempt a job's meta carries.

Job data is decompressed with a size cap before anything decodes it (a 509 KB zlib
bomb expands to gigabytes), in ``decompress_capped`` and in ``CappedJob``, the job class
every command and the worker hand rq, so that rq's own loading of a job hash is capped
too. The job's ``meta`` must be a JSON object whose ``attempt`` is a whole number in range.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

from rq.job import Job

_SHOWN_CHARS = 120
# A task is a few KB of JSON; 4 MiB leaves room (an oversized field still fails as an
# invalid task, naming the field) and keeps a bomb from costing memory.
DEFAULT_MAX_JOB_DATA_BYTES = 4_194_304
# Requeues count attempts from 0 up to REQUEUE_MAX_ATTEMPTS; anything above this is garbage.
MAX_ATTEMPT = 10_000


class JobDataTooLarge(ValueError):
    """Job data (or stored exception text) that decompresses beyond the cap."""


def decompress_capped(raw: bytes | str, max_bytes: int, *, what: str = "job data") -> bytes:
    """zlib-decompress ``raw`` (rq's format) into at most ``max_bytes``; raise beyond that.

    Data that is not zlib is returned as it is, as rq does. ``zlib.decompress``
    would allocate whatever the stream expands to before anyone could look at it.
    """
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > max_bytes:
        raise JobDataTooLarge(f"{what} is {len(data)} bytes, over the cap of {max_bytes}")
    decompressor = zlib.decompressobj()
    try:
        payload = decompressor.decompress(data, max_bytes + 1)
    except zlib.error:
        return data  # not compressed: rq falls back to the raw bytes the same way
    if len(payload) > max_bytes or decompressor.unconsumed_tail:
        raise JobDataTooLarge(
            f"{what} decompresses to more than the cap of {max_bytes} bytes (JOB_DATA_MAX_BYTES)"
        )
    if not decompressor.eof:
        return data  # a truncated stream: rq's zlib.decompress fails and keeps the raw bytes
    return payload


def job_attempt(meta: Any) -> int:
    """The job's ``meta["attempt"]``: 0 when absent; ValueError naming the problem otherwise."""
    if not isinstance(meta, dict):
        raise ValueError("job meta must be a JSON object")
    attempt = meta.get("attempt", 0)
    if attempt is None:
        return 0
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise ValueError(
            f"job meta.attempt must be a whole number from 0 to {MAX_ATTEMPT},"
            f" got {_shown(attempt)}"
        )
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"job meta.attempt must be from 0 to {MAX_ATTEMPT}, got {attempt}")
    return attempt


class CappedJob(Job):
    """rq's Job, refusing a hash whose data or exception text decompresses beyond the cap.

    rq decompresses both when it loads a job (at dequeue, before our vetting); the
    error it raises here carries the job id, so the worker fails that job visibly.
    """

    max_data_bytes: ClassVar[int] = DEFAULT_MAX_JOB_DATA_BYTES

    def restore(self, raw_data: Any) -> Any:
        if isinstance(raw_data, dict):
            for field in ("data", "exc_info"):
                value = raw_data.get(field.encode(), raw_data.get(field))
                if isinstance(value, bytes | str):
                    decompress_capped(value, self.max_data_bytes, what=f"job {field}")
        return super().restore(raw_data)


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 3] + "..."
