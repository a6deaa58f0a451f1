"""``agent-worker memory list|show|forget AGENT``: what an agent remembers, and erasing it.

``list`` shows the agent's memories oldest first (``--about NAME``: only those about or
naming someone; ``--json``: one record per line); ``show --id ID`` prints one in full;
``forget`` erases memories — one (``--id``), those about a person (``--about NAME``, for
a deletion request: every memory that is about them or names them), or, with neither,
all of the agent's, with their embeddings and its size entry. Exit 0 when done, 2 on
bad arguments or an id the agent does not have.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime

from redis.exceptions import RedisError

from worker.agents import AGENT_NAME_PATTERN
from worker.logs import log_event
from worker.memory import MemoryRecord, RedisMemoryStore
from worker.operations._redis_option import redis_url_parser
from worker.operations._session import open_session
from worker.redis_io import redis_error_line

_PREVIEW_CHARS = 80


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not re.fullmatch(AGENT_NAME_PATTERN, args.agent):
        parser.error(f"{args.agent!r} is not an agent name ({AGENT_NAME_PATTERN})")
    if args.action == "show" and not args.ids:
        parser.error("show: give the memory with --id ID")
    session = open_session(args.redis_url)
    store = RedisMemoryStore(session.redis)
    try:
        if args.action == "list":
            return _list(store, args.agent, about=args.about, as_json=args.json)
        if args.action == "show":
            return _show(store, args.agent, args.ids)
        return _forget(store, args.agent, ids=args.ids, about=args.about)
    except RedisError as exc:
        print(f"agent-worker memory: {session.redact(redis_error_line(exc))}", file=sys.stderr)
        return 1
    finally:
        session.redis.close()


def forget_memories(
    store: RedisMemoryStore, agent: str, *, ids: list[str] | None = None, about: str | None = None
) -> int:
    """Erase the named memories, those about ``about``, or (neither) all of the agent's."""
    if about is not None:
        named = [record.id for record in store.all(agent) if record.mentions(about)]
        chosen = [*named, *(ids or [])]
        forgotten = store.forget(agent, chosen) if chosen else 0
    else:
        forgotten = store.forget(agent, ids or None)
    log_event(
        "memory_forgotten",
        agent=agent,
        count=forgotten,
        ids=(ids or [])[:20],
        about_given=about is not None,
    )
    return forgotten


def _list(store: RedisMemoryStore, agent: str, *, about: str | None, as_json: bool) -> int:
    records = [r for r in store.all(agent) if about is None or r.mentions(about)]
    if as_json:
        for record in records:
            print(record.to_json())
        return 0
    usage = store.usage(agent)
    print(f"MEMORY OF {agent} ({usage.items} memories, {usage.bytes} bytes)")
    for record in records:
        preview = " ".join(record.text.split())[:_PREVIEW_CHARS]
        # Audience and provenance: who may recall it (a private task: trusted ones only).
        print(
            f"{record.id}  {record.kind.value}  {record.audience}  {record.provenance.value}  "
            f"{_when(record)}  {preview}"
        )
    return 0


def _show(store: RedisMemoryStore, agent: str, ids: list[str]) -> int:
    for memory_id in ids:
        record = store.get(agent, memory_id)
        if record is None:
            print(f"agent-worker memory: {agent} has no memory {memory_id!r}", file=sys.stderr)
            return 2
        print(json.dumps(json.loads(record.to_json()) | {"source": record.source()}, indent=2))
    return 0


def _forget(store: RedisMemoryStore, agent: str, *, ids: list[str], about: str | None) -> int:
    missing = [memory_id for memory_id in ids if store.get(agent, memory_id) is None]
    if missing:
        print(f"agent-worker memory: {agent} has no memory {missing[0]!r}", file=sys.stderr)
        return 2
    forgotten = forget_memories(store, agent, ids=ids or None, about=about)
    print(f"forgot {forgotten} memor{'y' if forgotten == 1 else 'ies'} of {agent}")
    return 0


def _when(record: MemoryRecord) -> str:
    return datetime.fromtimestamp(record.created_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-worker memory",
        description="List, show or erase what an agent remembers.",
        parents=[redis_url_parser()],
    )
    parser.add_argument(
        "action",
        choices=["list", "show", "forget"],
        help="list its memories (oldest first), show one (--id), or forget them",
    )
    parser.add_argument("agent", help="the agent's name")
    parser.add_argument(
        "--id", dest="ids", action="append", default=[], metavar="ID", help="one memory (repeat)"
    )
    parser.add_argument(
        "--about",
        metavar="NAME",
        help="memories about NAME or naming NAME (list, forget: for a deletion request)",
    )
    parser.add_argument("--json", action="store_true", help="list: one JSON record per line")
    return parser
