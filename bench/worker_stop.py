"""How long an idle worker, and an idle pool of them, takes to stop warm (SIGTERM).

Each command starts idle against the bench stack's Redis; once every worker has
registered with rq (and a second has passed, for rq's scheduler to start), it gets one
SIGTERM and the table shows the time until the process exited. "pubsub" is the
slowest worker's time from rq's "unsubscribing from channel" to our ``worker_stopped``
line: rq waits there up to 1 s for its command listener thread (stop-job, shutdown).
The rest is rq's scheduler finishing its one-second sleep (one worker per queue runs
it) and, for a pool, forking and reaping its workers.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._fleet import Mechanism, start_fleet
from bench._report import Summary, Table
from bench._size import Size
from bench._stack import BenchStack, bench_stack, parse_events

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0
# Each with the tasks in flight it is started for (none run: it only has the room).
COMMANDS: tuple[tuple[Mechanism, int], ...] = (
    (Mechanism("rq worker agents (a job process per task)", "rq", "rq worker"), 1),
    (Mechanism("rq worker agents, WORKER_CONCURRENCY=4", "rq", "rq worker", 1), 4),
    (
        Mechanism(
            "agent-worker pool --processes 4 --concurrency 2", "pool", "agent-worker pool", 4
        ),
        8,
    ),
    (
        Mechanism(
            "agent-worker pool --processes 8 --concurrency 2", "pool", "agent-worker pool", 8
        ),
        16,
    ),
)


def benchmark(size: Size = Size.FULL) -> list[Table]:
    runs = size.pick(full=10, quick=3, smoke=1)
    commands = COMMANDS[:1] if size is Size.SMOKE else COMMANDS
    table = Table(
        f"Warm stop of an idle worker or pool (SIGTERM to exit), {runs} runs each",
        ["command", "stop (s)", "min-max", "pubsub, slowest worker (s)", "min-max"],
    )
    with bench_stack() as bench:
        for mechanism, target in commands:
            stops, pubsub = [], []
            for _ in range(runs):
                stop_s, events = _stop_once(bench, mechanism, target)
                stops.append(stop_s)
                pubsub.append(_slowest_unsubscribe_s(events))
            table.add(mechanism.label, *Summary.of(stops).cells(2), *Summary.of(pubsub).cells(2))
    table.notes.append("pubsub: rq's unsubscribe, join of its listener thread (up to 1 s)")
    return [table]


def _stop_once(
    bench: BenchStack, mechanism: Mechanism, target: int
) -> tuple[float, list[dict[str, Any]]]:
    """Start it idle, SIGTERM it once all its workers serve; seconds to exit, its log."""
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as logdir:
        registered = bench.redis.scard("rq:workers")
        (process,) = start_fleet(bench, mechanism, target, Path(logdir))
        log_path = Path(logdir) / "worker-0.log"
        try:
            workers = registered + mechanism.registered_workers(target)
            _wait_for_workers(bench, process, workers, log_path)
            time.sleep(1.0)  # rq's scheduler process starts after the worker registers
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=STOP_TIMEOUT_S)
            stop_s = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        return stop_s, parse_events(log_path.read_text(errors="replace"))


def _wait_for_workers(
    bench: BenchStack, process: subprocess.Popen[bytes], count: int, log_path: Path
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while bench.redis.scard("rq:workers") < count:
        if process.poll() is not None:
            raise RuntimeError("it exited at start:\n" + log_path.read_text()[-2000:])
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} workers did not register in {READY_TIMEOUT_S} s")
        time.sleep(0.05)


def _slowest_unsubscribe_s(events: list[dict[str, Any]]) -> float:
    """The longest time one worker spent from rq's unsubscribe to its ``worker_stopped``."""
    unsubscribed = {}
    for event in events:
        message = str(event.get("message", ""))
        if event["event"] == "rq_log" and "unsubscribing from channel" in message:
            name = message.removeprefix("Worker ").partition(":")[0]
            unsubscribed[name] = datetime.fromisoformat(event["ts"])
    gaps = [
        (datetime.fromisoformat(event["ts"]) - unsubscribed[event["worker"]]).total_seconds()
        for event in events
        if event["event"] == "worker_stopped" and event["worker"] in unsubscribed
    ]
    if not gaps:
        raise RuntimeError("no worker logged its unsubscribe and its stop")
    return max(gaps)
