"""Dead letters: Hub writes the Hub refused, or that ran out of attempts, kept for an operator.

``agent-worker dead-letters list [--json] [--limit N]`` shows them newest first;
``replay ID... | --all`` sends them again now (same idempotency key, so the Hub
never creates anything twice) and ``drop ID... | --all`` forgets them. A dead
letter's id is its idempotency key (``<task_id>:consumption``, ``<task_id>:error``…).

A replay that the Hub accepts removes the dead letter; one the Hub still cannot
take (down, or an answer it cannot understand) goes back to the outbox with a
fresh attempt count, so the workers keep trying; one the Hub rejects again stays
dead with the new reason. Exit 0 when every named letter was handled, 1 when
some were rejected again, 2 on an unknown id or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import anyio
from redis import Redis
from redis.exceptions import RedisError

from hub_client import HubClient, HubRejected
from worker.hub_writes import OutboxItem, park, send
from worker.logs import log_event
from worker.operations._redis_option import redis_url_parser
from worker.operations._session import open_session
from worker.redis_io import keys as redis_keys
from worker.redis_io import redis_error_line

DEFAULT_LISTED = 20
_PREVIEW_CHARS = 80


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """One given-up write. ``id`` is its idempotency key; ``dead_at`` is ISO 8601 UTC."""

    id: str
    kind: str
    attempts: int
    status: int | None
    error: str
    dead_at: str | None
    payload: dict[str, Any]

    def item(self) -> OutboxItem:
        if self.id.startswith("unreadable:"):
            raise ValueError(f"dead letter {self.id} was not a readable outbox item")
        return OutboxItem(
            kind=self.kind,  # type: ignore[arg-type]  # checked by send()
            payload=self.payload,
            idempotency_key=self.id,
            attempts=0,
        )

    def summary(self) -> dict[str, Any]:
        """For ``status``: what and why, without the whole payload."""
        return {k: v for k, v in asdict(self).items() if k != "payload"}


def dead_letter_count(redis: Redis) -> int:
    return int(redis.hlen(redis_keys.OUTBOX_DEAD_LETTERS))


def list_dead_letters(redis: Redis, *, limit: int = DEFAULT_LISTED) -> list[DeadLetter]:
    """Newest first; at most ``limit`` (0 or less: all)."""
    end = limit - 1 if limit > 0 else -1
    members: list[bytes] = redis.zrevrange(redis_keys.OUTBOX_DEAD_LETTER_ORDER, 0, end)  # type: ignore[assignment]
    ids = [_text(raw) for raw in members]
    return [letter for letter in (_read(redis, key) for key in ids) if letter is not None]


def newest_dead_letter(redis: Redis) -> DeadLetter | None:
    newest = list_dead_letters(redis, limit=1)
    return newest[0] if newest else None


def drop_dead_letters(redis: Redis, ids: list[str]) -> int:
    """Forget these dead letters; returns how many existed."""
    if not ids:
        return 0
    with redis.pipeline() as pipe:
        pipe.hdel(redis_keys.OUTBOX_DEAD_LETTERS, *ids)
        pipe.zrem(redis_keys.OUTBOX_DEAD_LETTER_ORDER, *ids)
        dropped, _ = pipe.execute()
    log_event("dead_letters_dropped", count=int(dropped), ids=ids[:20])
    return int(dropped)


async def replay_dead_letter(
    redis: Redis, hub: HubClient, letter: DeadLetter, *, timeout_s: float
) -> str:
    """Send one dead letter again: ``delivered``, ``requeued`` (to the outbox) or ``rejected``."""
    try:
        item = letter.item()
        await send(hub, item, timeout_s=timeout_s)
    except (HubRejected, ValueError, KeyError) as exc:
        _keep_dead(redis, letter, exc)
        return "rejected"
    except Exception as exc:  # the Hub cannot take it yet: the workers keep trying
        park(redis, replace(letter.item(), attempts=0), delay_s=0)
        drop_dead_letters(redis, [letter.id])
        log_event("dead_letter_requeued", id=letter.id, kind=letter.kind, error=str(exc))
        return "requeued"
    drop_dead_letters(redis, [letter.id])
    log_event("dead_letter_replayed", id=letter.id, kind=letter.kind)
    return "delivered"


def _keep_dead(redis: Redis, letter: DeadLetter, exc: Exception) -> None:
    raw = redis.hget(redis_keys.OUTBOX_DEAD_LETTERS, letter.id)
    record = json.loads(raw) if raw else {}
    status = getattr(exc, "status", None)
    record.update(error=str(exc) or type(exc).__name__, status=status, replayed_at=_now())
    redis.hset(redis_keys.OUTBOX_DEAD_LETTERS, letter.id, json.dumps(record))
    log_event("dead_letter_rejected_again", "warning", id=letter.id, error=record["error"])


def _read(redis: Redis, key: str) -> DeadLetter | None:
    raw = redis.hget(redis_keys.OUTBOX_DEAD_LETTERS, key)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
        return DeadLetter(
            id=key,
            kind=str(record.get("kind", "?")),
            attempts=int(record.get("attempts", 0)),
            status=record.get("status") if isinstance(record.get("status"), int) else None,
            error=str(record.get("error", "")),
            dead_at=_iso(record.get("dead_at")),
            payload=dict(record.get("payload") or {}),
        )
    except (ValueError, TypeError):
        return DeadLetter(
            id=key,
            kind="?",
            attempts=0,
            status=None,
            error="unreadable record",
            dead_at=None,
            payload={},
        )


def _iso(epoch: Any) -> str | None:
    if not isinstance(epoch, int | float):
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _now() -> float:
    return datetime.now(UTC).timestamp()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


# --- the command -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-worker dead-letters",
        description="List, replay or drop Hub writes the Hub refused or that ran out of attempts.",
        parents=[redis_url_parser()],
    )
    actions = parser.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="list, replay or drop"
    )
    listing = actions.add_parser(
        "list", help="newest first", description="List dead letters, newest first."
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per dead letter")
    listing.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LISTED,
        metavar="N",
        help="show at most N (default %(default)s; 0: all)",
    )
    for name, help_text in (("replay", "send again now"), ("drop", "forget for good")):
        action = actions.add_parser(name, help=help_text, description=help_text.capitalize() + ".")
        action.add_argument("ids", nargs="*", metavar="ID", help="dead letter ids (their keys)")
        action.add_argument("--all", action="store_true", help="every dead letter")
    return parser


def main(argv: list[str]) -> int:
    """``agent-worker dead-letters list|replay|drop``."""
    parser = _parser()
    args = parser.parse_args(argv)
    session = open_session(args.redis_url)
    redis, redact, settings = session.redis, session.redact, session.settings
    try:
        if args.action == "list":
            return _list(redis, as_json=args.json, limit=args.limit, redact=redact)
        if args.all == bool(args.ids):
            parser.error(f"{args.action}: give dead letter ids or --all (not both)")
        letters = list_dead_letters(redis, limit=0) if args.all else _named(redis, args.ids)
        if letters is None:
            return 2
        if args.action == "drop":
            dropped = drop_dead_letters(redis, [letter.id for letter in letters])
            print(f"dropped {dropped} dead letter(s)")
            return 0
        return _replay_all(redis, letters, settings)
    except RedisError as exc:
        print(f"agent-worker dead-letters: {redact(redis_error_line(exc))}", file=sys.stderr)
        return 1
    finally:
        redis.close()


def _named(redis: Redis, ids: list[str]) -> list[DeadLetter] | None:
    letters = []
    for letter_id in ids:
        letter = _read(redis, letter_id)
        if letter is None:
            print(f"agent-worker dead-letters: no dead letter {letter_id!r}", file=sys.stderr)
            return None
        letters.append(letter)
    return letters


def _list(redis: Redis, *, as_json: bool, limit: int, redact: Callable[[str], str]) -> int:
    # The Hub's or the network's words: redacted whole before the preview cuts them.
    letters = [
        replace(letter, error=redact(letter.error))
        for letter in list_dead_letters(redis, limit=limit)
    ]
    if as_json:
        for letter in letters:
            print(json.dumps(asdict(letter)))
        return 0
    print(f"DEAD LETTERS ({dead_letter_count(redis)})")
    for letter in letters:
        error = " ".join(letter.error.split())[:_PREVIEW_CHARS]
        when = letter.dead_at[:19].replace("T", " ") + "Z" if letter.dead_at else "-"
        print(f"{letter.id}  {letter.kind}  {when}  attempts {letter.attempts}  {error}")
    return 0


def _replay_all(redis: Redis, letters: list[DeadLetter], settings: Any) -> int:
    api_key = settings.hub_api_key.get_secret_value() if settings.hub_api_key else None

    async def run() -> list[tuple[str, str]]:
        async with HubClient(settings.hub_url, api_key, timeout_s=settings.hub_timeout_s) as hub:
            return [
                (
                    letter.id,
                    await replay_dead_letter(redis, hub, letter, timeout_s=settings.hub_timeout_s),
                )
                for letter in letters
            ]

    results = anyio.run(run)
    for letter_id, result in results:
        print(f"{letter_id}: {result}")
    return 1 if any(result == "rejected" for _, result in results) else 0
