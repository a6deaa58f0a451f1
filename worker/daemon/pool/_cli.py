"""``agent-worker pool [--processes N] [--concurrency M] [--burst] [--worker-class PATH] [QUEUE]``.

Its defaults come from POOL_PROCESSES, POOL_CONCURRENCY and RQ_WORKER_CLASS."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rq.utils import import_attribute

from worker.daemon import AgentWorker
from worker.daemon.pool._supervisor import Pool
from worker.operations import redis_url_parser, use_redis_url
from worker.settings import settings_or_exit

DEFAULT_WORKER_CLASS = "worker.AgentWorker"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="agent-worker pool",
        description="Run N concurrent workers forked from one preloaded, supervising process.",
        parents=[redis_url_parser()],
    )
    parser.add_argument(
        "queues",
        nargs="*",
        default=["agents"],
        metavar="QUEUE",
        help="the queues its workers take tasks from (default: agents)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="worker processes (POOL_PROCESSES; default one per CPU core)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="tasks at once in each worker (POOL_CONCURRENCY, default 50)",
    )
    parser.add_argument(
        "--burst", action="store_true", help="each worker stops once the queues are empty"
    )
    parser.add_argument(
        "--worker-class",
        default=os.environ.get("RQ_WORKER_CLASS") or DEFAULT_WORKER_CLASS,
        help="an AgentWorker subclass (RQ_WORKER_CLASS, as rq worker reads it)",
    )
    args = parser.parse_args(list(argv))
    use_redis_url(args.redis_url)
    settings = settings_or_exit()
    if args.processes is None:
        args.processes = settings.pool_processes or os.cpu_count() or 1
    if args.concurrency is None:
        args.concurrency = settings.pool_concurrency
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.concurrency < 2:
        parser.error(
            "--concurrency must be at least 2 (for a job process per task, run rq worker agents)"
        )
    worker_class = _worker_class(args.worker_class)
    pool = Pool(
        worker_class,
        args.queues,
        processes=args.processes,
        concurrency=args.concurrency,
        burst=args.burst,
    )
    return pool.run(settings)


def _worker_class(path: str) -> type[AgentWorker]:
    try:
        found = import_attribute(path)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"agent-worker pool: worker class {path!r}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not (isinstance(found, type) and issubclass(found, AgentWorker)):
        print(f"agent-worker pool: {path!r} is not an AgentWorker subclass", file=sys.stderr)
        raise SystemExit(2)
    return found
