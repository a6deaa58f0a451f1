"""Hub writes that must not be lost: tried at once, parked in Redis when the Hub is down,
dead-lettered when the Hub refuses them.

The outbox is a sorted set scored by the next attempt time. Claiming an item
moves its score forward by a lease instead of removing it, so a worker that
dies mid-delivery leaves the item to be tried again, never dropped; every
item carries its idempotency key, so a second delivery creates nothing.

Every item is on its own: a failed attempt counts against that item only
(``attempts``), and after ``max_attempts`` it becomes a dead letter. What the
Hub rejects (``HubRejected``: a 4xx but 408/409/429, a 501 or 505) becomes a dead
letter at once. Dead letters wait in a hash (id = idempotency key) for an operator to replay or
drop them (``agent-worker dead-letters``, see ``worker.operations``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import anyio
from redis import Redis

from hub_client import ConsumptionRecord, HubClient, HubRejected, HubUnavailable
from hub_client.retry_rules import Backoff, Jitter
from worker.coordination import fence_revoked_run
from worker.logs import log_event
from worker.redis_io import keys as redis_keys

Kind = Literal["comment", "post", "consumption", "notifications_read", "activated"]
# What a dead letter is counted as: an item's kind, or an item that could not be read.
DEAD_LETTER_KINDS: tuple[str, ...] = (*get_args(Kind), "unreadable")
# Called with the item's kind whenever an item becomes a dead letter (a metric).
DeadLetterHook = Callable[[str], None]

CLAIM_LEASE_S = 60.0
MAX_BACKOFF_S = 300.0
_BACKOFF = Backoff(first_s=2.0, max_s=MAX_BACKOFF_S, jitter=Jitter.HALF)
DEFAULT_MAX_ATTEMPTS = 30
# A round stops after this many items in a row found no Hub at all: the rest wait.
_ROUND_GIVES_UP_AFTER = 3

# Take due items and push their score past the lease in one step, so two
# drainers never hold the same item.
_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], ARGV[3], member)
end
return due
"""


@dataclass(slots=True, kw_only=True, frozen=True)
class OutboxItem:
    kind: Kind
    payload: dict[str, Any]
    idempotency_key: str
    # Failed delivery attempts so far.
    attempts: int = 0

    def encode(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "payload": self.payload,
                "key": self.idempotency_key,
                "attempts": self.attempts,
            },
            sort_keys=True,
        )

    @classmethod
    def decode(cls, raw: bytes | str) -> OutboxItem:
        """Raises ValueError (or KeyError/TypeError) on a member that is not an item."""
        body = json.loads(raw)
        return cls(
            kind=body["kind"],
            payload=dict(body["payload"]),
            idempotency_key=str(body["key"]),
            attempts=int(body.get("attempts", 0)),
        )


@dataclass(slots=True, kw_only=True, frozen=True)
class DrainResult:
    delivered: int = 0
    deferred: int = 0
    dead: int = 0


async def send(hub: HubClient, item: OutboxItem, *, timeout_s: float | None = None) -> str | None:
    """One delivery attempt; returns the id the Hub gave to what it created, if any."""
    p = item.payload
    if item.kind == "comment":
        comment = await hub.create_comment(
            p["post_id"],
            agent_id=p["agent_id"],
            content=p["content"],
            idempotency_key=item.idempotency_key,
            timeout_s=timeout_s,
        )
        return comment.id
    if item.kind == "post":
        post = await hub.create_post(
            agent_id=p["agent_id"],
            content=p["content"],
            title=p.get("title"),
            community=p.get("community"),
            idempotency_key=item.idempotency_key,
            timeout_s=timeout_s,
        )
        return post.id
    if item.kind == "consumption":
        await hub.report_consumption(
            ConsumptionRecord.model_validate(p),
            idempotency_key=item.idempotency_key,
            timeout_s=timeout_s,
        )
        return None
    if item.kind == "notifications_read":
        await hub.mark_notifications_read(p["notification_ids"], timeout_s=timeout_s)
        return None
    if item.kind == "activated":
        await hub.mark_activated(p["agent_id"], timeout_s=timeout_s)
        return None
    raise ValueError(f"unknown outbox item kind {item.kind!r}")


class HubWriter:
    """The one path for a task's Hub writes: sends now, parks what may succeed later,
    dead-letters what the Hub refuses. ``write`` never raises (cancellation aside, and
    ``LeaseLost`` in a run its worker handed back)."""

    def __init__(
        self,
        hub: HubClient,
        redis: Redis,
        *,
        task_id: str,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        on_dead_letter: DeadLetterHook | None = None,
        timeout_s: float | None = None,
        budget_s: float | None = None,
    ) -> None:
        self._hub = hub
        self._redis = redis
        self._task_id = task_id
        self._max_attempts = max_attempts
        self._on_dead_letter = on_dead_letter
        self._timeout_s = timeout_s
        # All writes through this writer share ``budget_s``: once it is spent, the rest are
        # parked without trying, so a hanging Hub cannot hold a task past rq's hard timeout.
        self._ends_at = None if budget_s is None else time.monotonic() + budget_s
        self.parked = 0
        self.dead = 0

    async def write(self, item: OutboxItem, *, timeout_s: float | None = None) -> str | None:
        """The id of what the Hub created, or None (nothing created, parked or dead)."""
        fence_revoked_run()  # a run handed back writes nothing (raises LeaseLost)
        try:
            return await send(self._hub, item, timeout_s=self._call_timeout_s(timeout_s))
        except Exception as exc:  # whatever the Hub (or the client) does, the task settles
            failed = replace(item, attempts=item.attempts + 1)
            if _rejected(exc) or failed.attempts >= self._max_attempts:
                self._bury(failed, exc)
            else:
                self._park(failed, exc)
            return None

    def _call_timeout_s(self, timeout_s: float | None) -> float | None:
        chosen = timeout_s or self._timeout_s
        if self._ends_at is None:
            return chosen
        left = max(0.0, self._ends_at - time.monotonic())
        return left if chosen is None else min(chosen, left)

    def _bury(self, item: OutboxItem, exc: Exception) -> None:
        try:
            bury(self._redis, item, exc, on_dead_letter=self._on_dead_letter)
        except Exception as redis_error:  # Redis down too: say what is lost, never raise
            self._lost(item, exc, redis_error)
            return
        self.dead += 1

    def _park(self, item: OutboxItem, exc: Exception) -> None:
        try:
            park(self._redis, item, delay_s=_BACKOFF.delay_s(item.attempts))
        except Exception as redis_error:  # Redis down too: say what is lost, never raise
            self._lost(item, exc, redis_error)
            return
        self.parked += 1
        log_event(
            "hub_write_parked",
            "warning",
            task=self._task_id,
            kind=item.kind,
            idempotency_key=item.idempotency_key,
            error=_describe(exc),
        )

    def _lost(self, item: OutboxItem, exc: Exception, redis_error: Exception) -> None:
        log_event(
            "hub_write_lost",
            "error",
            task=self._task_id,
            kind=item.kind,
            idempotency_key=item.idempotency_key,
            error=_describe(exc),
            redis_error=str(redis_error),
        )


def park(redis: Redis, item: OutboxItem, *, delay_s: float) -> None:
    redis.zadd(redis_keys.OUTBOX, {item.encode(): time.time() + delay_s})


def outbox_size(redis: Redis) -> int:
    return int(redis.zcard(redis_keys.OUTBOX))


def bury(
    redis: Redis,
    item: OutboxItem,
    error: BaseException | str,
    *,
    on_dead_letter: DeadLetterHook | None = None,
    remove_raw: bytes | str | None = None,
) -> None:
    """Keep ``item`` as a dead letter (replacing one with the same key), logged and counted.

    ``remove_raw`` is the outbox member it came from, removed in the same transaction.
    """
    reason = error if isinstance(error, str) else _describe(error)
    status = getattr(error, "status", None)
    record = {
        "id": item.idempotency_key,
        "kind": item.kind,
        "idempotency_key": item.idempotency_key,
        "payload": item.payload,
        "attempts": item.attempts,
        "error": reason,
        "status": status if isinstance(status, int) else None,
        "dead_at": time.time(),
    }
    with redis.pipeline() as pipe:
        if remove_raw is not None:
            pipe.zrem(redis_keys.OUTBOX, remove_raw)
        pipe.hset(redis_keys.OUTBOX_DEAD_LETTERS, item.idempotency_key, json.dumps(record))
        pipe.zadd(redis_keys.OUTBOX_DEAD_LETTER_ORDER, {item.idempotency_key: time.time()})
        pipe.execute()
    log_event(
        "outbox_dead_letter",
        "error",
        kind=item.kind,
        idempotency_key=item.idempotency_key,
        attempts=item.attempts,
        status=record["status"],
        error=reason,
    )
    if on_dead_letter is not None:
        on_dead_letter(item.kind)


async def drain(
    redis: Redis,
    hub: HubClient,
    *,
    limit: int = 50,
    timeout_s: float = 10.0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    on_dead_letter: DeadLetterHook | None = None,
) -> DrainResult:
    """Deliver the items that are due; each failure counts against its own item only."""
    claim = redis.register_script(_CLAIM)
    now = time.time()
    due: list[bytes] = claim(keys=[redis_keys.OUTBOX], args=[now, limit, now + CLAIM_LEASE_S])
    counts = {"delivered": 0, "deferred": 0, "dead": 0}
    unreachable_in_a_row = 0
    for position, raw in enumerate(due):
        if unreachable_in_a_row >= _ROUND_GIVES_UP_AFTER:
            _release(redis, due[position:])
            break
        outcome, no_answer = await _deliver_one(
            redis, hub, raw, timeout_s, max_attempts, on_dead_letter
        )
        counts[outcome] += 1
        unreachable_in_a_row = unreachable_in_a_row + 1 if no_answer else 0
    result = DrainResult(**counts)
    if any(counts.values()):
        log_event(
            "outbox_drained", delivered=result.delivered, deferred=result.deferred, dead=result.dead
        )
    return result


async def _deliver_one(
    redis: Redis,
    hub: HubClient,
    raw: bytes,
    timeout_s: float,
    max_attempts: int,
    on_dead_letter: DeadLetterHook | None,
) -> tuple[Literal["delivered", "deferred", "dead"], bool]:
    """What became of one claimed member, and whether the Hub gave no answer at all."""
    try:
        item = OutboxItem.decode(raw)
    except (ValueError, KeyError, TypeError) as exc:
        _bury_garbage(redis, raw, exc, on_dead_letter)
        return "dead", False
    try:
        await send(hub, item, timeout_s=timeout_s)
    except Exception as exc:  # one item's failure, whatever it is, stays with that item
        failed = replace(item, attempts=item.attempts + 1)
        if _rejected(exc) or failed.attempts >= max_attempts:
            bury(redis, failed, exc, on_dead_letter=on_dead_letter, remove_raw=raw)
            return "dead", False
        with redis.pipeline() as pipe:
            pipe.zrem(redis_keys.OUTBOX, raw)
            pipe.zadd(
                redis_keys.OUTBOX,
                {failed.encode(): time.time() + _BACKOFF.delay_s(failed.attempts)},
            )
            pipe.execute()
        return "deferred", isinstance(exc, HubUnavailable) and exc.status is None
    redis.zrem(redis_keys.OUTBOX, raw)
    return "delivered", False


def _bury_garbage(
    redis: Redis, raw: bytes, exc: Exception, on_dead_letter: DeadLetterHook | None
) -> None:
    """A member that is not an item (a bug, or a hand edit) must not block the outbox."""
    text = raw.decode("utf-8", "replace")
    item = OutboxItem(
        kind="post",  # placeholder: replay refuses it (its payload is only the raw text)
        payload={"raw": text[:2000]},
        idempotency_key="unreadable:" + hashlib.sha256(raw).hexdigest()[:16],
        attempts=0,
    )
    bury(redis, item, f"unreadable outbox item: {exc}", on_dead_letter=None, remove_raw=raw)
    if on_dead_letter is not None:
        on_dead_letter(DEAD_LETTER_KINDS[-1])


def _release(redis: Redis, members: list[bytes]) -> None:
    """Give claimed, untried items back, due now, without counting an attempt."""
    if members:
        redis.zadd(redis_keys.OUTBOX, dict.fromkeys(members, time.time()))


def _rejected(exc: BaseException) -> bool:
    """The Hub refused the request itself (``HubRejected``): retrying cannot help."""
    return isinstance(exc, HubRejected)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


def drain_outbox_now(
    redis: Redis, *, on_dead_letter: DeadLetterHook, limit: int = 50
) -> DrainResult:
    """Deliver due outbox items from synchronous code (the worker parent's maintenance);
    ``on_dead_letter`` counts each item buried (the parent's own metrics)."""
    if redis.zcount(redis_keys.OUTBOX, "-inf", time.time()) == 0:
        return DrainResult()
    from worker.settings import settings

    config = settings()
    api_key = config.hub_api_key.get_secret_value() if config.hub_api_key else None

    async def run() -> DrainResult:
        async with HubClient(config.hub_url, api_key, timeout_s=config.hub_timeout_s) as hub:
            return await drain(
                redis,
                hub,
                limit=limit,
                max_attempts=config.outbox_max_attempts,
                on_dead_letter=on_dead_letter,
            )

    try:
        return anyio.run(run)
    except Exception as exc:  # maintenance must go on; the items stay for the next round
        log_event("outbox_drain_failed", "warning", error=str(exc))
        return DrainResult()
