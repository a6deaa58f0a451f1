"""``agent-worker``: the operator's command line.

Each subcommand is a thin adapter over a library function, so everything an
operator can do here is also callable from Python.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence

from redis import Redis
from redis.exceptions import RedisError

from worker._version import package_version
from worker.exceptions import ConfigurationError
from worker.operations._redis_option import REDIS_URL_OPTION, redis_url_parser, use_redis_url
from worker.redis_io import redis_error_line

# Commands that use no Redis: --redis-url is not taken out of their arguments.
_NO_REDIS = frozenset({"devhub", "executors", "schema"})


def _take_redis_url(arguments: list[str]) -> list[str]:
    """Apply and remove ``--redis-url URL`` / ``--redis-url=URL``, so each subcommand's own
    parser never needs to know it."""
    kept: list[str] = []
    remaining = iter(arguments)
    for argument in remaining:
        if argument == REDIS_URL_OPTION:
            url = next(remaining, None)
            if url is None:
                raise SystemExit(f"agent-worker: {REDIS_URL_OPTION} needs a URL")
            use_redis_url(url)
        elif argument.startswith(REDIS_URL_OPTION + "="):
            use_redis_url(argument.partition("=")[2])
        else:
            kept.append(argument)
    return kept


def _redis() -> Redis:
    from worker.redis_io import connect

    return connect()


def _devhub(args: argparse.Namespace, rest: list[str]) -> int:
    from hub_client.devhub import main as devhub_main

    return devhub_main(rest)


def _enqueue(args: argparse.Namespace, rest: list[str]) -> int:
    from worker.enqueue import enqueue_cli

    return enqueue_cli(args.source, _redis(), rerun=args.rerun)


def _unknown_task(redis: Redis, command: str, task_id: str) -> bool:
    """Say so (one line) when ``task_id`` names no job: a typo must not look like success."""
    from rq.job import Job

    from worker.operations._job_lookup import NOT_A_TASK_ID, UNKNOWN_TASK
    from worker.task import TASK_ID_PATTERN

    if not re.fullmatch(TASK_ID_PATTERN, task_id):
        reason = NOT_A_TASK_ID
    elif not redis.exists(Job.key_for(task_id)):
        reason = UNKNOWN_TASK
    else:
        return False
    print(f"agent-worker {command}: {task_id!r}: {reason}", file=sys.stderr)
    return True


def _cancel(args: argparse.Namespace, rest: list[str]) -> int:
    from worker.coordination import cancel_task

    redis = _redis()
    if _unknown_task(redis, "cancel", args.task_id):
        return 2
    print(cancel_task(redis, args.task_id))
    return 0


def _steer(args: argparse.Namespace, rest: list[str]) -> int:
    from worker.coordination import steer_task

    redis = _redis()
    if _unknown_task(redis, "steer", args.task_id):
        return 2
    print(steer_task(redis, args.task_id, args.text))
    return 0


def _schema(args: argparse.Namespace, rest: list[str]) -> int:
    import json

    from worker.agents import config_json_schema, public_json_schema

    schema = public_json_schema() if args.public else config_json_schema()
    print(json.dumps(schema, indent=2))
    return 0


Handler = Callable[[argparse.Namespace, list[str]], int]


def command_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(
        prog="agent-worker",
        description="Operate the Hub agent worker fleet.",
        epilog=f"Every command that uses Redis takes {REDIS_URL_OPTION} URL (default: REDIS_URL).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Handler] = {}

    def command(
        name: str, handler: Handler, help_text: str, *, uses_redis: bool = True
    ) -> argparse.ArgumentParser:
        handlers[name] = handler
        parents = [redis_url_parser()] if uses_redis else []
        return commands.add_parser(name, help=help_text, description=help_text, parents=parents)

    command(
        "devhub",
        _devhub,
        "run the local in-memory Hub (takes --host, --port, --api-key)",
        uses_redis=False,
    )
    schema = command(
        "schema",
        _schema,
        "print the JSON Schema of an agent's config.yaml (every key, its description, default)",
        uses_redis=False,
    )
    schema.add_argument(
        "--public",
        action="store_true",
        help="the public Botburrow format only: this worker's extensions are refused",
    )
    enqueue = command("enqueue", _enqueue, "validate and enqueue tasks (JSON, array or lines)")
    enqueue.add_argument("source", help="a file of tasks, or - for standard input")
    enqueue.add_argument(
        "--rerun",
        action="store_true",
        help="run again a task id that already ran (its report is replaced)",
    )
    cancel = command("cancel", _cancel, "stop a task at its next step (or drop it if queued)")
    cancel.add_argument("task_id", help="the task to stop")
    steer = command("steer", _steer, "add a message for a running task before its next step")
    steer.add_argument("task_id", help="the running task")
    steer.add_argument("text", help="the message, added as a user turn")
    for name, module, function, help_text in EXTENSIONS:
        handlers[name] = _extension(module, function)
        sub = commands.add_parser(name, help=help_text, description=help_text, add_help=False)
        sub.add_argument("args", nargs=argparse.REMAINDER)
    return parser, handlers


# Subcommands with their own argument parsing, in their own modules.
EXTENSIONS: list[tuple[str, str, str, str]] = [
    (
        "schedule",
        "worker.operations._schedule",
        "main",
        "enqueue explorations for stale agents (one leader per fleet)",
    ),
    (
        "status",
        "worker.operations._status_view",
        "main",
        "queues, workers and their tasks, recent failures, outbox (--json)",
    ),
    (
        "requeue",
        "worker.operations._repairs",
        "requeue_main",
        "put failed tasks back on their queue (attempt 0)",
    ),
    (
        "reload-agents",
        "worker.operations._repairs",
        "reload_agents_main",
        "drop cached agent definitions",
    ),
    ("report", "worker.operations._reports", "main", "the AgentReport of a task that ran (--json)"),
    (
        "check",
        "worker.operations._checks",
        "main",
        "check settings, Redis, definitions, MCP servers, grants and the Hub (--json)",
    ),
    (
        "dead-letters",
        "worker.operations._dead_letters",
        "main",
        "list, replay or drop Hub writes the Hub refused (list|replay|drop, ID... or --all)",
    ),
    (
        "memory",
        "worker.operations._memory",
        "main",
        "list, show or forget what an agent remembers (list|show|forget AGENT, --id, --about)",
    ),
    (
        "pool",
        "worker.daemon.pool._cli",
        "main",
        "run this host's workers: N concurrent workers forked from one preloaded process",
    ),
    (
        "executors",
        "worker.executors._listing",
        "main",
        "list executors and whether their CLIs are installed (--json)",
    ),
]


def _module_of(command: str) -> tuple[str, str]:
    return next((module, function) for name, module, function, _ in EXTENSIONS if name == command)


def _extension(module: str, function: str) -> Handler:
    def run(args: argparse.Namespace, rest: list[str]) -> int:
        import importlib

        main: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
        return main([*args.args, *rest])

    return run


# The status a command killed by SIGPIPE has in a shell (128 + 13), as `cat | head -1` shows.
_CLOSED_PIPE_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    """``agent-worker``. A reader that stops early (``| head -1``) ends the command quietly."""
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # here, not at exit (also after --help), to be caught below
    except BrokenPipeError:
        # Python would report the closed pipe again while flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _CLOSED_PIPE_STATUS


def _dispatch(argv: Sequence[str] | None) -> int:
    parser, handlers = command_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not (arguments[:1] and arguments[0] in _NO_REDIS):
        arguments = _take_redis_url(arguments)
    # devhub and the extension commands parse their own flags: hand them over in order.
    if arguments[:1] == ["devhub"]:
        return _devhub(argparse.Namespace(), arguments[1:])
    if arguments[:1] and arguments[0] in {name for name, *_ in EXTENSIONS}:
        try:
            return _extension(*_module_of(arguments[0]))(argparse.Namespace(args=arguments[1:]), [])
        except ConfigurationError as exc:
            print(f"agent-worker: {exc.message}", file=sys.stderr)
            return 2
    args, rest = parser.parse_known_args(arguments)
    if rest and args.command not in {name for name, *_ in EXTENSIONS}:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return handlers[args.command](args, rest)
    except ConfigurationError as exc:
        print(f"agent-worker: {exc.message}", file=sys.stderr)
        return 2
    except RedisError as exc:
        print(f"agent-worker: {redis_error_line(exc)}", file=sys.stderr)
        return 1
