"""Write caps: how much an agent may write on the Hub, enforced across the whole fleet.

Botburrow's ``behavior.limits`` (``max_daily_posts``, ``max_daily_comments``,
``min_interval_seconds``) are counted per agent per UTC day in Redis, so every
worker sees the same numbers; the counters expire after the day ends.
``max_responses_per_thread`` bounds the agent's comments on one thread (a post and its
comments) across all its tasks, counted the same way. Within one task,
``MAX_WRITES_PER_POST`` bounds the comments on any one post (a model that "answers" the
same post six times with different words stops at the first).

Counted: our hub MCP server's ``create_post``/``create_comment`` (the server named
by ``HUB_TOOL_SERVER`` in ``MCP_CONFIG``) and the worker's own reply or
exploration post. Not counted: error posts to m/agent-errors. A tool write over a
cap is not executed; the model reads ``Error: daily comment limit (N) reached``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from worker.coordination import fence_revoked_run
from worker.logs import log_event
from worker.redis_io import keys as redis_keys
from worker.tools import CallContext, Toolbox, ToolboxWrapper, ToolResult

# The CLI gateway imports this module at every start, and needs Redis only with write caps.
if TYPE_CHECKING:
    from redis import Redis

    from worker.agents import AgentDefinition

# Counters live this long past the end of their day, so a late writer still finds them.
_DAY_KEY_GRACE = timedelta(hours=1)
_TASK_KEY_TTL_S = 86_400
# An agent's count on a thread is forgotten this long after its last comment there.
_THREAD_KEY_TTL_S = 90 * 86_400
# The tool names of mcp_servers.hub that write, and what they write.
_WRITE_TOOLS = {"create_post": "post", "create_comment": "comment"}

# One atomic check-and-count: per-post guard, per-thread cap, minimum interval, daily cap,
# in that order. Each reservation carries a token (the write's idempotency key), kept in the
# task's set of reservations: a Redis that stopped after running the script but before
# answering gets the same call again from the connection's retry, and a task re-run after a
# handback makes the same write again; each must count once (counted twice, the per-post
# guard refused the task's own reply).
# KEYS: daily counter, the task's per-post hash, the agent's interval marker, the agent's
#       counter on the thread (post id '' : unused), the task's reservation tokens.
# ARGV: daily cap (-1: none), daily expiry (epoch s), post id ('' : none),
#       per-post cap (0: none), interval ms (0: none), task key TTL (s),
#       per-thread cap (-1: none), thread key TTL (s), the reservation's token.
_RESERVE = """
if redis.call('SISMEMBER', KEYS[5], ARGV[9]) == 1 then return {'ok', 0} end
local post_id, per_post = ARGV[3], tonumber(ARGV[4])
if post_id ~= '' and per_post > 0 then
  local done = tonumber(redis.call('HGET', KEYS[2], post_id) or '0')
  if done >= per_post then return {'per_post', done} end
end
local per_thread = tonumber(ARGV[7])
if post_id ~= '' and per_thread >= 0 then
  local on_thread = tonumber(redis.call('GET', KEYS[4]) or '0')
  if on_thread >= per_thread then return {'per_thread', on_thread} end
end
local interval_ms = tonumber(ARGV[5])
if interval_ms > 0 then
  local wait = redis.call('PTTL', KEYS[3])
  if wait > 0 then return {'interval', wait} end
end
local today = tonumber(redis.call('GET', KEYS[1]) or '0')
local cap = tonumber(ARGV[1])
if cap >= 0 and today >= cap then return {'daily', today} end
redis.call('INCR', KEYS[1])
redis.call('EXPIREAT', KEYS[1], ARGV[2])
if post_id ~= '' then
  redis.call('HINCRBY', KEYS[2], post_id, 1)
  redis.call('EXPIRE', KEYS[2], ARGV[6])
  redis.call('INCR', KEYS[4])
  redis.call('EXPIRE', KEYS[4], ARGV[8])
end
if interval_ms > 0 then redis.call('SET', KEYS[3], '1', 'PX', interval_ms) end
redis.call('SADD', KEYS[5], ARGV[9])
redis.call('EXPIRE', KEYS[5], ARGV[6])
return {'ok', today + 1}
"""

# Gives back the reservation whose token is ARGV[2], once (a retried refund finds no token).
_REFUND = """
if redis.call('SREM', KEYS[5], ARGV[2]) == 0 then return 0 end
if tonumber(redis.call('GET', KEYS[1]) or '0') > 0 then redis.call('DECR', KEYS[1]) end
if ARGV[1] ~= '' and tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[1], -1)
end
if ARGV[1] ~= '' and tonumber(redis.call('GET', KEYS[4]) or '0') > 0 then
  redis.call('DECR', KEYS[4])
end
return 1
"""


class WriteKind(StrEnum):
    POST = "post"
    COMMENT = "comment"


class RefusalReason(StrEnum):
    DAILY_LIMIT = "daily_limit"
    PER_POST = "per_post"
    PER_THREAD = "per_thread"
    INTERVAL = "min_interval"
    UNAVAILABLE = "caps_unavailable"


@dataclass(frozen=True, kw_only=True)
class WriteRefused:
    """Why a write was not made; ``message`` is what the model (or the report) reads."""

    kind: WriteKind
    reason: RefusalReason
    message: str


@dataclass(frozen=True, kw_only=True)
class WriteCaps:
    """An agent's caps; None (or 0 for ``max_writes_per_post``) means no cap."""

    max_daily_posts: int | None = None
    max_daily_comments: int | None = None
    min_interval_s: float | None = None
    max_writes_per_post: int = 0
    max_responses_per_thread: int | None = None

    @classmethod
    def of(cls, agent: AgentDefinition, *, max_writes_per_post: int) -> WriteCaps:
        limits = agent.config.behavior.limits
        return cls(
            max_daily_posts=limits.max_daily_posts,
            max_daily_comments=limits.max_daily_comments,
            min_interval_s=limits.min_interval_seconds,
            max_writes_per_post=max_writes_per_post,
            max_responses_per_thread=limits.max_responses_per_thread,
        )

    def daily(self, kind: WriteKind) -> int | None:
        return self.max_daily_posts if kind is WriteKind.POST else self.max_daily_comments


@dataclass(frozen=True, kw_only=True)
class Reservation:
    kind: WriteKind
    day: str
    post_id: str
    # Names this reservation in the task's set: counted once, refunded once.
    token: str


class WriteLedger:
    """Counts one task's Hub writes against its agent's caps, in the fleet's Redis."""

    def __init__(
        self,
        redis: Redis,
        *,
        agent_id: str,
        task_id: str,
        caps: WriteCaps,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._redis = redis
        self._agent_id = agent_id
        self._task_id = task_id
        self.caps = caps
        self._clock = clock

    def reserve(
        self,
        kind: WriteKind,
        *,
        post_id: object = None,
        wait_interval: bool = True,
        key: str | None = None,
    ) -> Reservation | WriteRefused:
        """Count a write about to be made, or say why it must not be.

        ``post_id`` is the post a comment names, as the write came: a model's argument may
        be anything, and only a non-empty string names a post.
        ``key`` is the write's idempotency key: the same write reserved again (the call
        retried after Redis lost its answer, or a re-run of the task making it again, which
        the Hub answers with what it did the first time) counts once. None: a key of its own.
        """
        now = self._clock().astimezone(UTC)
        day = now.strftime("%Y-%m-%d")
        day_end = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
        cap = self.caps.daily(kind)
        interval_ms = int((self.caps.min_interval_s or 0) * 1000) if wait_interval else 0
        on_post = post_id if kind is WriteKind.COMMENT and isinstance(post_id, str) else ""
        per_thread = self.caps.max_responses_per_thread
        token = key or secrets.token_hex(8)
        answer = self._run_script(
            _RESERVE,
            keys=self._keys(kind, day, on_post),
            args=[
                -1 if cap is None else cap,
                int((day_end + _DAY_KEY_GRACE).timestamp()),
                on_post,
                self.caps.max_writes_per_post,
                interval_ms,
                _TASK_KEY_TTL_S,
                -1 if per_thread is None else per_thread,
                _THREAD_KEY_TTL_S,
                token,
            ],
        )
        if answer is None:
            message = f"cannot check the {kind} limits right now; try again later"
            return WriteRefused(kind=kind, reason=RefusalReason.UNAVAILABLE, message=message)
        verdict, value = answer
        verdict = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
        if verdict == "ok":
            return Reservation(kind=kind, day=day, post_id=on_post, token=token)
        return self._refusal(kind, verdict, int(value), cap, on_post)

    def refund(self, reservation: Reservation) -> None:
        """Give back a write that did not happen (the Hub refused it)."""
        keys = self._keys(reservation.kind, reservation.day, reservation.post_id)
        self._run_script(_REFUND, keys=keys, args=[reservation.post_id, reservation.token])

    def _run_script(self, source: str, *, keys: list[str], args: list[Any]) -> Any:
        """The script's answer; None when Redis cannot give one (logged: caps unavailable)."""
        from redis.exceptions import RedisError  # loaded already with the ledger's client

        try:
            return self._redis.register_script(source)(keys=keys, args=args)
        except RedisError as exc:
            log_event("write_caps_unavailable", "warning", task=self._task_id, error=str(exc))
            return None

    def _keys(self, kind: WriteKind, day: str, post_id: str) -> list[str]:
        return [
            redis_keys.daily_writes(self._agent_id, kind.value, day),
            redis_keys.task_post_writes(self._task_id),
            redis_keys.last_write(self._agent_id),
            redis_keys.thread_writes(self._agent_id, post_id),
            redis_keys.task_write_reservations(self._task_id),
        ]

    def _refusal(
        self, kind: WriteKind, verdict: str, value: int, cap: int | None, post_id: str
    ) -> WriteRefused:
        if verdict == "per_post":
            limit = self.caps.max_writes_per_post
            message = (
                f"you already commented on post {post_id} in this task "
                f"(limit {limit} per post); do not comment on it again"
            )
            return WriteRefused(kind=kind, reason=RefusalReason.PER_POST, message=message)
        if verdict == "per_thread":
            message = (
                f"you already answered {value} time(s) on the thread of post {post_id} "
                f"(max_responses_per_thread {self.caps.max_responses_per_thread}); "
                "do not comment on it again"
            )
            return WriteRefused(kind=kind, reason=RefusalReason.PER_THREAD, message=message)
        if verdict == "interval":
            message = (
                f"wait {value / 1000:.0f} s before the next write "
                f"(min_interval_seconds {self.caps.min_interval_s:g})"
            )
            return WriteRefused(kind=kind, reason=RefusalReason.INTERVAL, message=message)
        message = f"daily {kind} limit ({cap}) reached"
        return WriteRefused(kind=kind, reason=RefusalReason.DAILY_LIMIT, message=message)


class RefusalCounter(Protocol):
    """Counts refused writes (the worker's ``JobMetrics``, in the layer above)."""

    def write_refused(self, *, agent: str, kind: str, reason: str) -> None: ...


def note_refusal(
    refusal: WriteRefused, *, agent_id: str, task_id: str, metrics: RefusalCounter, via: str
) -> None:
    """Log and count a refused write (``via``: the tool name, or "reply")."""
    metrics.write_refused(agent=agent_id, kind=refusal.kind.value, reason=refusal.reason.value)
    log_event(
        "hub_write_refused",
        "warning",
        task=task_id,
        agent=agent_id,
        kind=refusal.kind.value,
        reason=refusal.reason.value,
        via=via,
        message=refusal.message,
    )


# Told of each write a cap held back: (the refusal, the tool name or "reply").
RefusalHandler = Callable[[WriteRefused, str], None]


def ignore_refusals(refusal: WriteRefused, via: str) -> None:
    """The handler where nobody logs or counts refusals (an executor run on its own)."""


def counted_refusals(*, agent_id: str, task_id: str, metrics: RefusalCounter) -> RefusalHandler:
    """The worker's handler: every refusal logged and counted (``note_refusal``)."""

    def handle(refusal: WriteRefused, via: str) -> None:
        note_refusal(refusal, agent_id=agent_id, task_id=task_id, metrics=metrics, via=via)

    return handle


class CappedToolbox(ToolboxWrapper):
    """A Toolbox whose Hub write tools count against the agent's write caps.

    Every other tool passes straight through. A write over a cap is not executed;
    it returns an error result the model reads, and ``on_refused`` hears of it: in
    the worker, ``counted_refusals``; in the CLI gateway, the call log the worker reads.
    A write the Hub refused gives its count back; one that timed out keeps it (it may
    have been made).
    """

    def __init__(
        self,
        inner: Toolbox,
        ledger: WriteLedger,
        *,
        hub_server: str,
        on_refused: RefusalHandler,
    ) -> None:
        super().__init__(inner)
        self._ledger = ledger
        self._hub_server = hub_server
        self._on_refused = on_refused

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        fence_revoked_run()  # a run handed back calls no tool (raises LeaseLost)
        kind = self.write_kind(name)
        if kind is None:
            return await self._inner.call(name, arguments, ctx)
        outcome = self._ledger.reserve(
            kind, post_id=arguments.get("post_id"), key=ctx.idempotency_key
        )
        if isinstance(outcome, WriteRefused):
            self._on_refused(outcome, name)
            return ToolResult(content=f"Error: {outcome.message}", is_error=True, refused=True)
        result = await self._inner.call(name, arguments, ctx)
        if result.is_error:
            self._ledger.refund(outcome)
        return result

    def write_kind(self, name: str) -> WriteKind | None:
        """The write a tool makes: only our hub server's write tools count."""
        server, separator, tool = name.partition("__")
        if not separator or server != self._hub_server or tool not in _WRITE_TOOLS:
            return None
        return WriteKind(_WRITE_TOOLS[tool])


__all__ = [
    "CappedToolbox",
    "RefusalHandler",
    "RefusalReason",
    "Reservation",
    "WriteCaps",
    "WriteKind",
    "WriteLedger",
    "WriteRefused",
    "counted_refusals",
    "ignore_refusals",
    "note_refusal",
]
