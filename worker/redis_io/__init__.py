"""Redis plumbing every stage shares: one connection factory, outage handling, our keys.

``keys`` (``from worker.redis_io import keys as redis_keys``) names every Redis key the
project writes. The connection factory gives rq and our own code the same plain or
Sentinel-managed connection; the fault helpers tell an outage (wait and retry) from a
bug. ``CappedJob`` is how every command loads an rq job (its data capped), and
``register_child_process`` how a job records the process groups it starts outside its
own. The names load on first use, so that reaching for ``keys`` does not import redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.redis_io._children import (
        child_process_recorder,
        kill_recorded_process_groups,
        recording_children_of,
        register_child_process,
    )
    from worker.redis_io._connection import (
        FREE_CONNECTION_WAIT_S,
        RQ_CONFIG_MODULE,
        SentinelPrimaryConnection,
        SentinelPrimarySSLConnection,
        connect,
        is_sentinel_managed,
        parse_sentinel_addresses,
        require_matching_worker_connection,
        rq_connection_settings,
        share_between_threads,
    )
    from worker.redis_io._faults import (
        DEFAULT_REDIS_PATIENCE_S,
        OUTAGE_KINDS,
        REDIS_UNAVAILABLE,
        PatientRetry,
        RedisOutage,
        access_refusal,
        check_redis_access,
        is_redis_outage,
        outage_kind,
        patient_redis_retry,
        redis_error_line,
        until_redis_answers,
    )
    from worker.redis_io._handover import take_job_list
    from worker.redis_io._jobs import (
        DEFAULT_MAX_JOB_DATA_BYTES,
        CappedJob,
        JobDataTooLarge,
        decompress_capped,
        job_attempt,
    )

_CONNECTION = "worker.redis_io._connection"
_FAULTS = "worker.redis_io._faults"
_CHILDREN = "worker.redis_io._children"
_JOBS = "worker.redis_io._jobs"
_LAZY = {
    "child_process_recorder": _CHILDREN,
    "kill_recorded_process_groups": _CHILDREN,
    "recording_children_of": _CHILDREN,
    "register_child_process": _CHILDREN,
    "DEFAULT_MAX_JOB_DATA_BYTES": _JOBS,
    "CappedJob": _JOBS,
    "JobDataTooLarge": _JOBS,
    "decompress_capped": _JOBS,
    "job_attempt": _JOBS,
    "FREE_CONNECTION_WAIT_S": _CONNECTION,
    "RQ_CONFIG_MODULE": _CONNECTION,
    "SentinelPrimaryConnection": _CONNECTION,
    "SentinelPrimarySSLConnection": _CONNECTION,
    "connect": _CONNECTION,
    "is_sentinel_managed": _CONNECTION,
    "parse_sentinel_addresses": _CONNECTION,
    "require_matching_worker_connection": _CONNECTION,
    "rq_connection_settings": _CONNECTION,
    "share_between_threads": _CONNECTION,
    "DEFAULT_REDIS_PATIENCE_S": _FAULTS,
    "REDIS_UNAVAILABLE": _FAULTS,
    "PatientRetry": _FAULTS,
    "RedisOutage": _FAULTS,
    "access_refusal": _FAULTS,
    "check_redis_access": _FAULTS,
    "redis_error_line": _FAULTS,
    "is_redis_outage": _FAULTS,
    "OUTAGE_KINDS": _FAULTS,
    "outage_kind": _FAULTS,
    "patient_redis_retry": _FAULTS,
    "until_redis_answers": _FAULTS,
    "take_job_list": "worker.redis_io._handover",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "DEFAULT_MAX_JOB_DATA_BYTES",
    "DEFAULT_REDIS_PATIENCE_S",
    "FREE_CONNECTION_WAIT_S",
    "OUTAGE_KINDS",
    "REDIS_UNAVAILABLE",
    "RQ_CONFIG_MODULE",
    "CappedJob",
    "JobDataTooLarge",
    "PatientRetry",
    "RedisOutage",
    "SentinelPrimaryConnection",
    "SentinelPrimarySSLConnection",
    "access_refusal",
    "check_redis_access",
    "child_process_recorder",
    "connect",
    "decompress_capped",
    "is_redis_outage",
    "is_sentinel_managed",
    "job_attempt",
    "kill_recorded_process_groups",
    "outage_kind",
    "parse_sentinel_addresses",
    "patient_redis_retry",
    "recording_children_of",
    "redis_error_line",
    "register_child_process",
    "require_matching_worker_connection",
    "rq_connection_settings",
    "share_between_threads",
    "take_job_list",
    "until_redis_answers",
]
