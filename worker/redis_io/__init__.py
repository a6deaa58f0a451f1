"""Redis plumbing every stage shares: one connection factory, outage handling, our keys.

``keys`` (``from worker.redis_io import keys as redis_keys``) names every Redis key the
project writes. The connection factory gives rq and our own code the same plain or
Sentinel-managed connection; the fault helpers tell an outage (wait and retry) from a
bug. ``CappedJob`` is how every command loads an rq job (its data capped), and
``child_process_recorder`` how a job records the process groups it starts outside its
own. The names load on first use, so that reaching for ``keys`` does not import redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.redis_io._children import child_process_recorder as child_process_recorder
    from worker.redis_io._children import (
        kill_recorded_process_groups as kill_recorded_process_groups,
    )
    from worker.redis_io._children import recording_children_of as recording_children_of
    from worker.redis_io._connection import connect as connect
    from worker.redis_io._connection import (
        require_matching_worker_connection as require_matching_worker_connection,
    )
    from worker.redis_io._connection import rq_connection_settings as rq_connection_settings
    from worker.redis_io._connection import share_between_threads as share_between_threads
    from worker.redis_io._faults import OUTAGE_KINDS as OUTAGE_KINDS
    from worker.redis_io._faults import PatientRetry as PatientRetry
    from worker.redis_io._faults import access_refusal as access_refusal
    from worker.redis_io._faults import check_redis_access as check_redis_access
    from worker.redis_io._faults import is_redis_outage as is_redis_outage
    from worker.redis_io._faults import outage_kind as outage_kind
    from worker.redis_io._faults import patient_redis_retry as patient_redis_retry
    from worker.redis_io._faults import redis_error_line as redis_error_line
    from worker.redis_io._faults import until_redis_answers as until_redis_answers
    from worker.redis_io._handover import take_job_list as take_job_list
    from worker.redis_io._jobs import DEFAULT_MAX_JOB_DATA_BYTES as DEFAULT_MAX_JOB_DATA_BYTES
    from worker.redis_io._jobs import CappedJob as CappedJob
    from worker.redis_io._jobs import JobDataTooLarge as JobDataTooLarge
    from worker.redis_io._jobs import decompress_capped as decompress_capped
    from worker.redis_io._jobs import job_attempt as job_attempt


__getattr__ = lazy_getattr(__name__)
