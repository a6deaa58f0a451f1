"""``agent-worker schedule``: the scheduler process, one round per interval while it leads.

``run_forever`` leads or waits until SIGTERM or SIGINT and releases the lock on the way
out; ``run_once`` (``--once``, for cron) runs one round if no other scheduler leads.
"""

from __future__ import annotations

import argparse
import math
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

from redis.exceptions import RedisError

from hub_client import HubError
from worker.agents import AgentStore
from worker.logs import log_event, set_level, set_redactor
from worker.operations._leader_lock import LeaderLock
from worker.operations._redis_option import redis_url_parser, use_redis_url
from worker.operations._scheduler import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_PER_ROUND,
    DEFAULT_MIN_STALENESS_S,
    HubStaleAgents,
    ScheduleConfig,
    Scheduler,
)
from worker.redaction import process_redactor
from worker.redis_io import (
    check_redis_access,
    connect,
    is_redis_outage,
    outage_kind,
    patient_redis_retry,
)
from worker.settings import settings_or_exit


def run_once(scheduler: Scheduler, lock: LeaderLock) -> int:
    """One round if this process can lead (cron); 0 also when another scheduler leads."""
    try:
        if not lock.hold():
            print(
                f"agent-worker schedule: another scheduler holds the lock "
                f"({lock.holder() or 'just released'}); nothing enqueued"
            )
            return 0
        try:
            scheduler.run_round()
        finally:
            lock.release()
    except (RedisError, HubError) as exc:
        _log_round_failure(exc)
        return 1
    return 0


def run_forever(scheduler: Scheduler, lock: LeaderLock, stop: threading.Event) -> int:
    """Lead or wait, one round per interval, until ``stop`` is set; releases the lock on exit."""
    # None until the first turn, so that turn always logs which role this process has.
    leading: bool | None = None
    log_event(
        "scheduler_started",
        token=lock.token,
        interval_s=scheduler.config.interval_s,
        min_staleness_s=scheduler.config.min_staleness_s,
        max_per_round=scheduler.config.max_per_round,
    )
    try:
        while not stop.is_set():
            leading = _turn(scheduler, lock, was_leading=leading)
            stop.wait(scheduler.config.interval_s)
    finally:
        with suppress(RedisError):
            lock.release()
        log_event("scheduler_stopped", token=lock.token)
    return 0


def _turn(scheduler: Scheduler, lock: LeaderLock, *, was_leading: bool | None) -> bool:
    try:
        leading = lock.hold()
        if leading != was_leading:
            if leading:
                log_event("scheduler_leader", token=lock.token)
            else:
                log_event("scheduler_follower", token=lock.token, holder=lock.holder())
        if leading:
            scheduler.run_round()
    except (RedisError, HubError) as exc:
        _log_round_failure(exc)
        return False
    return leading


def _log_round_failure(exc: Exception) -> None:
    """A Redis outage or refusal is an outage (the next round tries again), not a bug."""
    if is_redis_outage(exc):
        log_event(
            "redis_unavailable",
            "warning",
            during="schedule_round",
            kind=outage_kind(exc),
            error=str(exc),
        )
    else:
        log_event("schedule_round_failed", "error", error=str(exc))


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    watched = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, request_stop) for signum in watched}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-worker schedule",
        description="Enqueue exploration tasks for stale agents (one leader at a time).",
        parents=[redis_url_parser()],
    )
    parser.add_argument("--once", action="store_true", help="run one round and exit (cron)")
    parser.add_argument(
        "--interval-s",
        type=_positive_float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between rounds, and the length of a slot (default %(default)s)",
    )
    parser.add_argument(
        "--min-staleness-s",
        type=_count(0),
        default=DEFAULT_MIN_STALENESS_S,
        help="an agent is stale after this many seconds without activation (default %(default)s)",
    )
    parser.add_argument(
        "--max-per-round",
        type=_count(1),
        default=DEFAULT_MAX_PER_ROUND,
        help="enqueue at most this many explorations per round (default %(default)s)",
    )
    return parser


def main(argv: list[str]) -> int:
    """``agent-worker schedule [--once] [--interval-s] [--min-staleness-s] [--max-per-round]``."""
    args = _parser().parse_args(argv)
    use_redis_url(args.redis_url)
    settings = settings_or_exit()
    set_level(settings.log_level)
    set_redactor(process_redactor(settings.secret_values()))
    config = ScheduleConfig(
        interval_s=args.interval_s,
        min_staleness_s=args.min_staleness_s,
        max_per_round=args.max_per_round,
        result_ttl_s=settings.result_ttl_s,
        timeout_grace_s=settings.job_timeout_grace_s,
    )
    redis = connect(settings)
    # Before the patient retry: a wrong password is not an outage to wait out.
    check_redis_access(redis)
    # The worker's patience: a restart or a refused write (OOM, READONLY) is waited out.
    redis.set_retry(patient_redis_retry(settings.redis_patience_s))
    agents = AgentStore(settings.agents_dir, redis=redis, ttl_s=settings.agent_cache_ttl_s)
    api_key = settings.hub_api_key.get_secret_value() if settings.hub_api_key else None
    hub = HubStaleAgents(settings.hub_url, api_key, timeout_s=settings.hub_timeout_s)
    scheduler = Scheduler(redis, agents, hub, config)
    lock = LeaderLock(redis, ttl_s=config.lock_ttl_s)
    stop = threading.Event()
    try:
        # With --once, a SIGTERM lets the round finish and release the lock.
        with _stop_on_signals(stop):
            return run_once(scheduler, lock) if args.once else run_forever(scheduler, lock, stop)
    finally:
        agents.close()
        redis.close()
