"""``--redis-url``: the one option every command that reads or writes Redis takes.

Each command's parser inherits it from ``redis_url_parser`` (so every ``--help`` shows
it) and applies it with ``use_redis_url`` before it reads its settings.
"""

from __future__ import annotations

import argparse
import os

REDIS_URL_OPTION = "--redis-url"


def use_redis_url(url: str | None) -> None:
    """Make ``url`` the REDIS_URL of this process, before its settings are read."""
    if not url:
        return
    from worker.settings import settings

    os.environ["REDIS_URL"] = url
    settings.cache_clear()


def redis_url_parser() -> argparse.ArgumentParser:
    """The ``--redis-url`` option, for ``parents=[...]`` of every subcommand's parser that
    uses Redis: one definition, so every ``--help`` shows it."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        REDIS_URL_OPTION,
        dest="redis_url",
        metavar="URL",
        help="use this Redis instead of REDIS_URL",
    )
    return parent
