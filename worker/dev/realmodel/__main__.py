"""``python -m worker.dev.realmodel setup|eval``: the real local model and its evaluation.

setup [--model 1.5b] [--model 0.5b]   build llama-server, assemble the models (cached)
eval [--model 1.5b] [--only NAME]     run the scenarios through the real worker
"""

from __future__ import annotations

import argparse
import sys

from worker.dev.realmodel._setup import MODELS, SetupError, cache_dir, ensure_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.dev.realmodel")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="build llama-server and assemble the models")
    setup.add_argument("--model", action="append", choices=sorted(MODELS), dest="models")
    evaluate = commands.add_parser("eval", help="run the scenarios against a real model")
    evaluate.add_argument("--model", choices=sorted(MODELS), default="1.5b")
    evaluate.add_argument("--only", action="append", default=[], help="a scenario's name")
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

    with llama_server(cache, MODELS[args.model]) as model:
        print(f"realmodel: {model.alias} on {model.base_url} (pid {model.pid})", file=sys.stderr)
        rows = run_eval(model, only=args.only)
    for row in rows:  # what the agent wrote, for a reader of the table
        reply = " ".join(row.reply.split())[:300] or "(no reply)"
        print(f"realmodel: {row.scenario}: {reply}", file=sys.stderr)
    print(table(rows, model.alias))
    return 0


if __name__ == "__main__":
    sys.exit(main())
