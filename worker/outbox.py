"""Hub writes that must not be lost: tried at once, parked in Redis when the Hub is down.

The outbox is a sorted set scored by the next attempt time. Claiming an item
moves its score forward by a lease instead of removing it, so a worker that
dies mid-delivery leaves the item to be tried again, never dropped; every
item carries its idempotency key, so a second delivery creates nothing.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from redis import Redis

from hub_client import ConsumptionRecord, HubClient, HubRejected, HubUnavailable
from worker import redis_keys
from worker.logs import log_event

Kind = Literal["comment", "post", "consumption", "notifications_read", "activated"]
DEAD_LETTERS = redis_keys.OUTBOX + ":dead"
CLAIM_LEASE_S = 60.0
MAX_BACKOFF_S = 300.0

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
        body = json.loads(raw)
        return cls(
            kind=body["kind"],
            payload=body["payload"],
            idempotency_key=body["key"],
            attempts=body["attempts"],
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
    """Sends a write now; parks it in the outbox when the Hub cannot take it."""

    def __init__(self, hub: HubClient, redis: Redis, *, task_id: str) -> None:
        self._hub = hub
        self._redis = redis
        self._task_id = task_id
        self.parked = 0

    async def write(self, item: OutboxItem, *, timeout_s: float | None = None) -> str | None:
        try:
            return await send(self._hub, item, timeout_s=timeout_s)
        except HubUnavailable as exc:
            park(self._redis, item, delay_s=_backoff(0))
            self.parked += 1
            log_event(
                "hub_write_parked",
                "warning",
                task=self._task_id,
                kind=item.kind,
                idempotency_key=item.idempotency_key,
                error=str(exc),
            )
            return None


def park(redis: Redis, item: OutboxItem, *, delay_s: float) -> None:
    redis.zadd(redis_keys.OUTBOX, {item.encode(): time.time() + delay_s})


def outbox_size(redis: Redis) -> int:
    return int(redis.zcard(redis_keys.OUTBOX))


async def drain(
    redis: Redis, hub: HubClient, *, limit: int = 50, timeout_s: float = 10.0
) -> DrainResult:
    """Deliver the items that are due; reschedule what the Hub still cannot take."""
    claim = redis.register_script(_CLAIM)
    now = time.time()
    due = claim(keys=[redis_keys.OUTBOX], args=[now, limit, now + CLAIM_LEASE_S])
    delivered = deferred = dead = 0
    for raw in due:
        item = OutboxItem.decode(raw)
        try:
            await send(hub, item, timeout_s=timeout_s)
        except HubUnavailable:
            retry = OutboxItem(
                kind=item.kind,
                payload=item.payload,
                idempotency_key=item.idempotency_key,
                attempts=item.attempts + 1,
            )
            with redis.pipeline() as pipe:
                pipe.zrem(redis_keys.OUTBOX, raw)
                pipe.zadd(
                    redis_keys.OUTBOX, {retry.encode(): time.time() + _backoff(retry.attempts)}
                )
                pipe.execute()
            deferred += 1
            continue
        except HubRejected as exc:
            # The Hub will never take it: keep it for an operator instead of retrying forever.
            with redis.pipeline() as pipe:
                pipe.zrem(redis_keys.OUTBOX, raw)
                pipe.rpush(DEAD_LETTERS, json.dumps({"item": item.encode(), "error": str(exc)}))
                pipe.execute()
            log_event(
                "outbox_item_rejected",
                "error",
                kind=item.kind,
                idempotency_key=item.idempotency_key,
                error=str(exc),
            )
            dead += 1
            continue
        redis.zrem(redis_keys.OUTBOX, raw)
        delivered += 1
    if delivered or deferred or dead:
        log_event("outbox_drained", delivered=delivered, deferred=deferred, dead=dead)
    return DrainResult(delivered=delivered, deferred=deferred, dead=dead)


def _backoff(attempts: int) -> float:
    return float(min(MAX_BACKOFF_S, 2.0 * 2**attempts) * random.uniform(0.5, 1.0))


def drain_outbox_now(redis: Redis, *, limit: int = 50) -> DrainResult:
    """Deliver due outbox items from synchronous code (the worker parent's maintenance)."""
    if redis.zcount(redis_keys.OUTBOX, "-inf", time.time()) == 0:
        return DrainResult()
    from worker.settings import settings

    config = settings()
    api_key = config.hub_api_key.get_secret_value() if config.hub_api_key else None

    async def run() -> DrainResult:
        async with HubClient(config.hub_url, api_key, timeout_s=config.hub_timeout_s) as hub:
            return await drain(redis, hub, limit=limit)

    try:
        return anyio.run(run)
    except Exception as exc:  # maintenance must go on; the items stay for the next round
        log_event("outbox_drain_failed", "warning", error=str(exc))
        return DrainResult()
