"""``python -m bench [--quick | --smoke] [NAME ...]``: run the benchmarks, one table each.

Without names every benchmark runs, in the order below. ``--quick`` runs fewer
repetitions (its numbers are not the ones to quote); ``--smoke`` runs each benchmark
once at its smallest size, seconds rather than minutes: the test suite runs it to
prove every benchmark still starts (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Sequence

from bench._report import Table, machine_info
from bench._size import Size

BENCHMARKS = (
    "loop_overhead",
    "loop_components",
    "budgeting",
    "model_request",
    "redaction",
    "metrics_scrape",
    "mcp",
    "end_to_end",
    "memory",
    "memory_recall",
    "scaling",
    "in_flight",
    "connections",
    "library_floor",
    "cli_sandbox",
    "crash_recovery",
    "worker_stop",
    "prompt_cache",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(BENCHMARKS)}"
    )
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="fewer repetitions")
    sizes.add_argument("--smoke", action="store_true", help="each once, at its smallest size")
    args = parser.parse_args(argv)
    size = Size.SMOKE if args.smoke else Size.QUICK if args.quick else Size.FULL
    if unknown := sorted(set(args.names) - set(BENCHMARKS)):
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)
    started = time.monotonic()
    print("== machine")
    for line in machine_info():
        print(f"   {line}")
    print(flush=True)
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        benchmark: Callable[..., list[Table]] = module.benchmark
        began = time.monotonic()
        for table in benchmark(size=size):
            print(table.render())
        print(f"   ({name}: {time.monotonic() - began:.0f} s)\n", flush=True)
    print(f"all benchmarks: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
