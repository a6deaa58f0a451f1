"""The parent's vetting of raw job hashes: capped decompression, meta checks, control fields."""

from __future__ import annotations

import json
import tracemalloc
import zlib
from typing import Any

import fakeredis
import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from worker.daemon._vetting import Verdict, check_job, producer_control_fields
from worker.enqueue import JOB_FUNCTION
from worker.redis_io import (
    DEFAULT_MAX_JOB_DATA_BYTES,
    CappedJob,
    JobDataTooLarge,
    decompress_capped,
    job_attempt,
)

ALLOWED = frozenset({JOB_FUNCTION})
CAP = 1_048_576
TASK = {"task_id": "t-1", "type": "exploration", "agent_id": "demo-agent"}


def zlib_bomb(expanded_bytes: int) -> bytes:
    """A valid zlib stream of zeros: a few tens of KB that expand to ``expanded_bytes``."""
    compressor = zlib.compressobj(9)
    chunk = b"\0" * 1_048_576
    parts = [compressor.compress(chunk) for _ in range(expanded_bytes // len(chunk))]
    return b"".join(parts) + compressor.flush()


def job_data(task: Any = TASK) -> bytes:
    return zlib.compress(json.dumps([JOB_FUNCTION, None, [task], {}]).encode())


def write_job(redis: fakeredis.FakeRedis, data: bytes, meta: Any = None) -> str:
    fields: dict[str | bytes, bytes | str] = {
        "data": data,
        "origin": "agents",
        "status": "queued",
    }
    if meta is not None:
        fields["meta"] = meta if isinstance(meta, str | bytes) else json.dumps(meta)
    redis.hset("rq:job:t-1", mapping=fields)
    return "rq:job:t-1"


def test_a_zlib_bomb_is_refused_without_expanding_it() -> None:
    bomb = zlib_bomb(200 * 1_048_576)  # 200 MB of zeros in ~200 KB
    assert len(bomb) < 1_048_576

    tracemalloc.start()
    try:
        with pytest.raises(JobDataTooLarge, match="JOB_DATA_MAX_BYTES"):
            decompress_capped(bomb, CAP)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Never more than the cap plus the input and bookkeeping, never the 200 MB.
    assert peak < 8 * 1_048_576


def test_data_within_the_cap_decodes_and_raw_data_is_kept_as_rq_keeps_it() -> None:
    payload = json.dumps([JOB_FUNCTION, None, [TASK], {}]).encode()
    assert decompress_capped(zlib.compress(payload), CAP) == payload
    assert decompress_capped(payload, CAP) == payload  # not compressed
    truncated = zlib.compress(payload)[:-6]
    assert decompress_capped(truncated, CAP) == truncated  # rq's fallback: the raw bytes


def test_check_job_fails_a_bomb_as_undecodable_naming_the_cap(
    redis: fakeredis.FakeRedis,
) -> None:
    key = write_job(redis, zlib_bomb(20 * 1_048_576))

    check = check_job(redis, key, ALLOWED, max_data_bytes=CAP)

    assert check.verdict is Verdict.UNDECODABLE
    assert "job data refused" in check.reason and str(CAP) in check.reason


def test_rq_loading_a_bomb_through_the_capped_job_class_raises(
    redis: fakeredis.FakeRedis,
) -> None:
    write_job(redis, zlib_bomb(2 * DEFAULT_MAX_JOB_DATA_BYTES))

    with pytest.raises(JobDataTooLarge):
        CappedJob.fetch("t-1", connection=redis, serializer=JSONSerializer)
    bomb = zlib_bomb(2 * DEFAULT_MAX_JOB_DATA_BYTES)
    redis.hset("rq:job:t-1", mapping={"data": job_data(), "exc_info": bomb})
    with pytest.raises(JobDataTooLarge, match="job exc_info"):
        CappedJob.fetch("t-1", connection=redis, serializer=JSONSerializer)


def test_the_capped_job_class_loads_a_normal_job(redis: fakeredis.FakeRedis) -> None:
    write_job(redis, job_data(), meta={"attempt": 2})

    job = CappedJob.fetch("t-1", connection=redis, serializer=JSONSerializer)

    assert isinstance(job, Job)
    assert job.args == [TASK]
    assert job.meta == {"attempt": 2}


@pytest.mark.parametrize(
    ("raw_meta", "problem"),
    [
        ('{"attempt": "first"}', "meta.attempt must be a whole number"),
        ('{"attempt": 1e999}', "got inf"),
        ('{"attempt": 2.5}', "meta.attempt must be a whole number"),
        ('{"attempt": true}', "meta.attempt must be a whole number"),
        ('{"attempt": -1}', "from 0 to"),
        ('{"attempt": 100000000000000000000}', "from 0 to"),
        ('["attempt", 1]', "must be a JSON object"),
        ("{not json", "must be a JSON object"),
    ],
)
def test_invalid_meta_makes_the_job_undecodable_with_a_reason(
    redis: fakeredis.FakeRedis, raw_meta: str, problem: str
) -> None:
    key = write_job(redis, job_data(), meta=raw_meta)

    check = check_job(redis, key, ALLOWED)

    assert check.verdict is Verdict.UNDECODABLE
    assert problem in check.reason


@pytest.mark.parametrize("meta", [None, {}, {"attempt": 0}, {"attempt": 3}, {"attempt": None}])
def test_valid_meta_is_runnable(redis: fakeredis.FakeRedis, meta: Any) -> None:
    key = write_job(redis, job_data(), meta=meta)

    check = check_job(redis, key, ALLOWED)

    assert check.verdict is Verdict.RUNNABLE
    assert check.task == TASK


def test_job_attempt_reads_whole_numbers_only() -> None:
    assert job_attempt({}) == 0
    assert job_attempt({"attempt": 4}) == 4
    with pytest.raises(ValueError, match="'first'"):
        job_attempt({"attempt": "first"})


def test_producer_written_control_fields_are_dropped_and_the_rest_kept() -> None:
    raw = json.dumps({"attempt": 1, "requeue": {"delay_s": 0}, "report": {"x": 1}, "note": "n"})

    assert producer_control_fields(raw) == {"attempt": 1, "note": "n"}
    assert producer_control_fields(json.dumps({"attempt": 1})) is None
    assert producer_control_fields(None) is None
    assert producer_control_fields("{broken") is None
