"""``python -m worker.dev.scripted_endpoint``: serve the scripted endpoint until SIGINT/SIGTERM.

Prints one JSON line with ``"event": "scripted_endpoint_ready"`` and the base URL on
stderr once it accepts requests (with ``--port 0`` that line names the chosen port).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import uvicorn
from pydantic import ValidationError

from worker.dev.scripted_endpoint._runner import bind_listener, server_config
from worker.dev.scripted_endpoint._scenarios import (
    NO_TURN_LEFT,
    ScenarioFile,
    ScenarioStore,
    ScriptedTurn,
)
from worker.dev.scripted_endpoint._server import create_app
from worker.logs import log_event


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted; returns the process exit status."""
    args = _parser().parse_args(argv)
    try:
        store = _store(args)
    except (OSError, ValueError, ValidationError) as exc:
        print(f"scripted_endpoint: {exc}", file=sys.stderr)
        return 2
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        print(
            f"scripted_endpoint: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 2
    port = int(listener.getsockname()[1])
    host = f"[{args.host}]" if ":" in args.host else args.host
    server = _AnnouncedServer(
        server_config(create_app(store), args.host), url=f"http://{host}:{port}"
    )
    # uvicorn re-raises the signal that stopped it to the handler installed before it:
    # a no-op there makes SIGTERM a clean exit 0 instead of death by signal.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, _ignore_signal)
    server.run(sockets=[listener])
    return 0


class _AnnouncedServer(uvicorn.Server):
    """Says on stderr when it serves, for whoever started the process and waits for it."""

    def __init__(self, config: uvicorn.Config, *, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            log_event("scripted_endpoint_ready", url=self._url)


def _store(args: argparse.Namespace) -> ScenarioStore:
    scenarios: dict[str, list[ScriptedTurn]] = {}
    default_turn = NO_TURN_LEFT
    latency_s = args.latency_s
    if args.scenario_file is not None:
        loaded = ScenarioFile.model_validate_json(Path(args.scenario_file).read_text())
        scenarios = loaded.scenarios
        default_turn = loaded.default_turn or default_turn
        if latency_s is None:
            latency_s = loaded.latency_s
    if args.default_turn is not None:
        default_turn = ScriptedTurn.model_validate(json.loads(args.default_turn))
    return ScenarioStore(scenarios=scenarios, latency_s=latency_s or 0.0, default_turn=default_turn)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker.dev.scripted_endpoint",
        description="Scripted OpenAI/Anthropic-compatible LLM endpoint for tests, "
        "benchmarks and the demo.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=8090, help="0 picks a free port (default 8090)")
    parser.add_argument(
        "--scenario-file",
        type=Path,
        default=None,
        help='JSON: {"scenarios": {"name": [turns...]}, "default_turn": {...}, "latency_s": 0}',
    )
    parser.add_argument(
        "--latency-s", type=float, default=None, help="pause before every model answer"
    )
    parser.add_argument(
        "--default-turn",
        default=None,
        help='answer when a scenario has no turn left, e.g. \'{"dynamic": "demo-agent"}\'',
    )
    return parser


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    return None


if __name__ == "__main__":
    sys.exit(main())
