"""What a forked job process hands its worker through Redis (metrics, spans): a list per job
and a pending mark, so a worker that died before reading them leaves them for a sweep."""

from __future__ import annotations

from typing import Any


def take_job_list(redis: Any, key: str, pending_key: str, job_id: str) -> list[Any]:
    """The job's list, read and dropped with its pending mark in one transaction: two
    workers taking the same job's list never both get it."""
    with redis.pipeline(transaction=True) as pipe:
        pipe.lrange(key, 0, -1)
        pipe.delete(key)
        pipe.zrem(pending_key, job_id)
        records, _, _ = pipe.execute()
    return list(records)
