"""``python -m worker.dev.realmodel setup [--model 1.5b] [--model 0.5b]``."""

from __future__ import annotations

import argparse
import sys

from worker.dev.realmodel._setup import MODELS, SetupError, cache_dir, ensure_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.dev.realmodel")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="build llama-server and assemble the models")
    setup.add_argument("--model", action="append", choices=sorted(MODELS), dest="models")
    args = parser.parse_args(argv)
    cache = cache_dir()
    try:
        ensure_all(cache, args.models or sorted(MODELS))
    except SetupError as error:
        print(f"realmodel: {error}", file=sys.stderr)
        return 1
    print(f"realmodel: ready in {cache}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
