"""Every ``agent-worker`` subcommand and flag, read from the parsers the commands build.

Most subcommands parse their own arguments in their own module (``EXTENSIONS`` of
``worker.operations``). Each is called with ``--help`` while ``parse_known_args`` is
held: the parser it built is caught before anything runs, so the reference shows exactly
what the command accepts.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

from worker.dev.docs._markdown import code, table
from worker.operations import EXTENSIONS, command_parser


class _Built(Exception):
    """Raised from ``parse_known_args`` to hand back the parser a command built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _raise_built(
    parser: argparse.ArgumentParser, *args: object, **kwargs: object
) -> tuple[argparse.Namespace, list[str]]:
    raise _Built(parser)


@contextmanager
def _catching_parsers() -> Iterator[None]:
    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", _raise_built):
        yield


def _built_by(main: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    with _catching_parsers():
        try:
            main(["--help"])
        except _Built as built:
            return built.parser
    raise RuntimeError(f"{main.__module__}.{main.__name__} parsed no arguments")


@dataclass(frozen=True, kw_only=True)
class Command:
    name: str
    parser: argparse.ArgumentParser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def commands() -> list[Command]:
    """``agent-worker`` itself, then each subcommand (and each action of one that has them)."""
    root, _ = command_parser()
    found = [Command(name="agent-worker", parser=root)]
    extensions = {name: (module, function) for name, module, function, _ in EXTENSIONS}
    for name, sub in _subparsers(root).items():
        if name == "devhub":
            from hub_client.devhub import main as devhub_main

            sub = _built_by(devhub_main)
        elif name in extensions:
            module, function = extensions[name]
            sub = _built_by(getattr(importlib.import_module(module), function))
        found.append(Command(name=f"agent-worker {name}", parser=sub))
        found.extend(
            Command(name=f"agent-worker {name} {action}", parser=nested)
            for action, nested in _subparsers(sub).items()
        )
    return found


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def _spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        return str(action.metavar or action.dest).upper()
    names = ", ".join(action.option_strings)
    takes_value = action.nargs != 0
    return f"{names} {action.metavar or action.dest.upper()}" if takes_value else names


def _meaning(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    # As argparse's own --help expands it: %(default)s and the like.
    return text % {**vars(action), "prog": prog} if "%(" in text else text


def _section(command: Command) -> str:
    parser = command.parser
    usage = parser.format_usage().removeprefix("usage: ").strip()
    # Subcommands parse their own arguments: their usage names them as they are typed.
    usage = " ".join(usage.split())
    lines = [
        f"### `{command.name}`",
        "",
        parser.description or "",
        "",
        f"```text\n{usage}\n```",
        "",
    ]
    flags = _flags(parser)
    if flags:
        rows = [(code(_spelling(action)), _meaning(action, parser.prog)) for action in flags]
        lines.append(table(("argument", "meaning"), rows))
    subcommands = _subcommand_help(parser)
    if subcommands:
        lines.append(table(("command", "what it does"), subcommands))
    if parser.epilog:
        lines.extend([parser.epilog, ""])
    return "\n".join(lines)


def _subcommand_help(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """Each subcommand (or action) of ``parser``, linked to its section, with its help."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                name = f"{parser.prog} {choice.dest}"
                rows.append((f"[{code(name)}](#{name.replace(' ', '-')})", choice.help or ""))
    return rows


def command_table() -> str:
    return "\n".join(_section(command) for command in commands())


def undocumented_flags() -> list[str]:
    return [
        f"{command.name} {_spelling(action)}"
        for command in commands()
        for action in _flags(command.parser)
        if not (action.help or "").strip()
    ] + [command.name for command in commands() if not (command.parser.description or "").strip()]
