"""``python -m worker.dev.realmodel setup|eval``: the real local model and its evaluation.

setup [--model 1.5b] [--model 0.5b]   build llama-server, assemble the models (cached)
eval [--model 1.5b] [--only NAME]     run the scenarios through the real worker
serve [--model 1.5b]                  run llama-server until interrupted (for `make demo`)
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from worker.dev.realmodel._setup import MODELS, SetupError, cache_dir, ensure_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.dev.realmodel")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="build llama-server and assemble the models")
    setup.add_argument("--model", action="append", choices=sorted(MODELS), dest="models")
    evaluate = commands.add_parser("eval", help="run the scenarios against a real model")
    evaluate.add_argument("--model", choices=sorted(MODELS), default="1.5b")
    evaluate.add_argument("--only", action="append", default=[], help="a scenario's name")
    serve = commands.add_parser("serve", help="run llama-server for the model until interrupted")
    serve.add_argument("--model", choices=sorted(MODELS), default="1.5b")
    args = parser.parse_args(argv)
    cache = cache_dir()
    keys = args.models or sorted(MODELS) if args.command == "setup" else [args.model]
    try:
        ensure_all(cache, keys)
    except SetupError as error:
        print(f"realmodel: {error}", file=sys.stderr)
        return 1
    print(f"realmodel: ready in {cache}", file=sys.stderr)
    if args.command == "setup":
        return 0
    # Imported here: the set-up above needs only the standard library.
    from worker.dev.realmodel._eval import run_eval, table
    from worker.dev.realmodel._server import llama_server

    if args.command == "serve":
        return _serve(cache, args.model)
    with llama_server(cache, MODELS[args.model]) as model:
        print(f"realmodel: {model.alias} on {model.base_url} (pid {model.pid})", file=sys.stderr)
        run = run_eval(model, only=args.only)
    for row in run.rows:  # what the agent wrote, for a reader of the table
        reply = " ".join(row.reply.split())[:300] or "(no reply)"
        print(f"realmodel: {row.scenario}: {reply}", file=sys.stderr)
    print(table(run.rows, model.alias, run.worker_s))
    return 0


def _serve(cache: Path, key: str) -> int:
    """The same llama-server the evaluation starts, until SIGINT or SIGTERM stops it."""
    from worker.dev.realmodel._server import llama_server

    # SIGTERM unwinds like Ctrl-C, so llama-server is stopped by the block below either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with llama_server(cache, MODELS[key]) as model:
        print(f"OPENAI_BASE_URL={model.base_url}", flush=True)
        print(
            f"realmodel: {model.alias} (pid {model.pid}, log {model.log_path}); Ctrl-C stops it",
            file=sys.stderr,
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
