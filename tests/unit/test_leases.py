"""Leases renewed while a task runs, a lost lease stopping the task, journaled tool intents,
and how Redis refusals are classified and waited out."""

from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    BusyLoadingError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.workers import wait_until
from worker.coordination import AgentSlots, LeaseLost, RedisControl, RedisJournal, TaskLease
from worker.coordination._checkpoints import IntentJournalingToolbox
from worker.models._types import ToolSpec
from worker.redis_io import is_redis_outage, outage_kind, patient_redis_retry, until_redis_answers
from worker.redis_io import keys as redis_keys
from worker.redis_io._faults import RedisOutage
from worker.tools import ContentKeyedToolbox
from worker.tools._base import CallContext, Granted, Resolution, ToolResult
from worker.tools._idempotency import content_key

# The shortest lease TaskLease takes (1 s): renewed every third of it.
TTL_S = 1.0


# --- leases --------------------------------------------------------------------------------


def test_a_held_lease_outlives_its_ttl_while_renewed(redis: fakeredis.FakeRedis) -> None:
    lease = TaskLease(redis, "t-long", holder="host:1", ttl_s=TTL_S)
    assert lease.acquire()
    try:
        time.sleep(3 * TTL_S)  # three TTLs: without renewal it would be long gone
        assert lease.holder() == "host:1"
        second_copy = TaskLease(redis, "t-long", holder="host:2", ttl_s=TTL_S, renew=False)
        assert not second_copy.acquire()
    finally:
        lease.release()
    assert redis.get(redis_keys.task_lease("t-long")) is None


def test_without_renewal_the_lease_lapses(redis: fakeredis.FakeRedis) -> None:
    lease = TaskLease(redis, "t-short", holder="host:1", ttl_s=TTL_S, renew=False)
    assert lease.acquire()
    wait_until(lambda: lease.holder() is None, 5, "the lease to lapse")


def test_a_lapsed_lease_is_taken_back_and_another_holder_is_never_overwritten(
    redis: fakeredis.FakeRedis,
) -> None:
    lease = TaskLease(redis, "t-1", holder="host:1", ttl_s=60)
    assert lease.acquire()
    key = redis_keys.task_lease("t-1")
    try:
        redis.delete(key)
        assert lease.renew()
        assert redis.get(key) == b"host:1"
        redis.set(key, "host:2")
        assert not lease.renew()
        assert redis.get(key) == b"host:2"
    finally:
        lease.release()
    assert redis.get(key) == b"host:2"  # release frees only our own lease


def test_a_released_lease_is_not_renewed_again(redis: fakeredis.FakeRedis) -> None:
    lease = TaskLease(redis, "t-done", holder="host:1", ttl_s=TTL_S)
    assert lease.acquire()
    lease.release()
    time.sleep(2 * TTL_S)
    assert redis.exists(redis_keys.task_lease("t-done")) == 0


def test_an_agent_slot_is_kept_past_its_ttl_while_its_task_runs(
    redis: fakeredis.FakeRedis,
) -> None:
    slots = AgentSlots(redis, "busy-agent", limit=1, ttl_s=TTL_S)
    assert slots.take("t-1")
    try:
        time.sleep(3 * TTL_S)
        assert slots.running() == ["t-1"]
        assert not AgentSlots(redis, "busy-agent", limit=1, ttl_s=TTL_S, renew=False).take("t-2")
    finally:
        slots.release("t-1")
    assert slots.running() == []


@pytest.mark.anyio
async def test_a_lease_taken_by_another_copy_stops_the_task_at_its_next_step(
    redis: fakeredis.FakeRedis,
) -> None:
    control = RedisControl(redis, "t-1", watch_parent=False, lease_holder_name="host:1")
    key = redis_keys.task_lease("t-1")

    assert not (await control.poll()).cancelled  # no lease at all: a lapse, not a loss
    redis.set(key, "host:1")
    assert not (await control.poll()).cancelled
    redis.set(key, "host:2")
    with pytest.raises(LeaseLost, match="host:2"):
        await control.poll()


# --- tool intents and idempotency keys ----------------------------------------------------


class RecordingToolbox:
    """Records each call's key, and whether its intent was in Redis when it ran."""

    def __init__(self, journal: RedisJournal | None = None) -> None:
        self.journal = journal
        self.calls: list[tuple[str, bool]] = []

    def offered(self) -> Sequence[ToolSpec]:
        return []

    def resolve(self, name: str) -> Resolution:
        return Granted(spec=ToolSpec(name=name, description="", input_schema={}), server="hub")

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        journaled = self.journal is not None and (
            self.journal.intent(ctx.step, ctx.index) is not None
        )
        self.calls.append((ctx.meta()["idempotency_key"], journaled))
        return ToolResult(content="Created post p-1.")


def context(step: int, index: int, task_id: str = "t-1") -> CallContext:
    return CallContext(task_id=task_id, agent_id="a", step=step, index=index, timeout_s=5.0)


@pytest.mark.anyio
async def test_the_intent_is_in_redis_before_the_call_runs(redis: fakeredis.FakeRedis) -> None:
    journal = RedisJournal(redis, "t-1")
    inner = RecordingToolbox(journal)
    toolbox = IntentJournalingToolbox(inner, journal)

    await toolbox.call("hub__create_post", {"content": "hi"}, context(1, 1))

    assert inner.calls == [("t-1:tool:1:1", True)]
    intent = journal.intent(1, 1)
    assert intent is not None and intent.idempotency_key == "t-1:tool:1:1"


@pytest.mark.anyio
async def test_a_rerun_repeats_an_in_doubt_call_with_its_recorded_key(
    redis: fakeredis.FakeRedis, log_stream: io.StringIO
) -> None:
    journal = RedisJournal(redis, "t-1")
    await IntentJournalingToolbox(RecordingToolbox(), journal).call(
        "hub__create_post", {"content": "hi"}, context(2, 1)
    )
    # The process died after the call, before its checkpoint: the re-run calls again.
    rerun = RecordingToolbox()
    await IntentJournalingToolbox(rerun, RedisJournal(redis, "t-1")).call(
        "hub__create_post", {"content": "hi"}, context(2, 1)
    )

    assert rerun.calls == [("t-1:tool:2:1", False)]
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert [e["event"] for e in events if e["event"] == "tool_call_in_doubt"] == [
        "tool_call_in_doubt"
    ]


@pytest.mark.anyio
async def test_clearing_the_journal_drops_the_intents(redis: fakeredis.FakeRedis) -> None:
    journal = RedisJournal(redis, "t-1")
    await IntentJournalingToolbox(RecordingToolbox(), journal).call(
        "hub__create_post", {"content": "hi"}, context(1, 1)
    )
    journal.clear()
    assert journal.intent(1, 1) is None
    assert redis.keys("*") == []


@pytest.mark.anyio
async def test_cli_keys_name_the_write_not_its_position() -> None:
    first_run, second_run = RecordingToolbox(), RecordingToolbox()
    for inner, writes in (
        (first_run, ["first comment", "second comment"]),
        # The re-run from the start writes something new first, then the old write again.
        (second_run, ["a different comment", "first comment", "first comment"]),
    ):
        toolbox = ContentKeyedToolbox(inner)
        for position, text in enumerate(writes, start=1):
            await toolbox.call("hub__create_comment", {"content": text}, context(position, 1))

    first_keys = [key for key, _ in first_run.calls]
    second_keys = [key for key, _ in second_run.calls]
    assert second_keys[0] not in first_keys  # a new write never gets an old answer
    assert second_keys[1] == first_keys[0]  # the same write replays
    assert second_keys[2] == content_key(
        "t-1", "hub__create_comment", {"content": "first comment"}, 2
    )
    assert len(set(first_keys + second_keys)) == 4


# --- Redis refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'."), "oom"),
        (ReadOnlyError("You can't write against a read only replica."), "readonly"),
        (BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (RedisConnectionError("Connection refused"), "connection"),
        (ResponseError("MISCONF Redis is configured to save RDB snapshots"), "misconf"),
        (ResponseError("UNBLOCKED force unblock from blocking operation"), "unblocked"),
    ],
)
def test_refusals_are_outages(error: Exception, kind: str) -> None:
    assert is_redis_outage(error)
    assert outage_kind(error) == kind


def test_a_plain_command_error_is_not_an_outage() -> None:
    assert not is_redis_outage(ResponseError("WRONGTYPE Operation against a key"))


def test_the_patient_retry_covers_refused_writes() -> None:
    retry = patient_redis_retry()
    calls: list[int] = []

    def refused_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OutOfMemoryError("OOM command not allowed")
        return "OK"

    assert retry.call_with_retry(refused_twice, lambda error: None) == "OK"
    assert len(calls) == 3


@pytest.mark.parametrize("patience_s", [0.5, 5.0, 33.0, 120.0])
def test_the_patient_retry_waits_as_long_as_redis_patience_s_says(patience_s: float) -> None:
    retry = patient_redis_retry(patience_s)
    backoff = ExponentialBackoff(cap=2.0, base=0.1)
    waits = [backoff.compute(failures) for failures in range(1, retry.get_retries() + 1)]
    # Just enough retries: their waits reach the patience, one fewer would not.
    assert sum(waits) >= patience_s > sum(waits[:-1])


def test_a_patient_retry_stops_waiting_in_every_connection_it_was_given() -> None:
    retry = patient_redis_retry(33.0)
    # redis-py deep-copies a retry into each connection; a shared one reaches them all.
    copies = [copy.deepcopy(retry) for _ in range(3)]
    retry.stop_waiting()
    calls: list[int] = []

    def refused() -> str:
        calls.append(1)
        raise OutOfMemoryError("OOM command not allowed")

    for each in copies:
        with pytest.raises(OutOfMemoryError):
            each.call_with_retry(refused, lambda error: None)
    assert len(calls) == 3  # one attempt each, no wait


def test_until_redis_answers_waits_out_refusals_and_reraises_the_rest(
    log_stream: io.StringIO,
) -> None:
    outcomes: list[Exception | str] = [
        OutOfMemoryError("OOM"),
        ReadOnlyError("READONLY"),
        "done",
    ]
    waits: list[float] = []
    seen: list[str] = []

    def action() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    result = until_redis_answers(
        "test",
        action,
        sleep=waits.append,
        on_outage=lambda during, exc: seen.append(outage_kind(exc)),
    )

    assert result == "done"
    assert waits == [1.0, 2.0]
    assert seen == ["oom", "readonly"]
    logged = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert [(e["event"], e["kind"]) for e in logged] == [
        ("redis_unavailable", "oom"),
        ("redis_unavailable", "readonly"),
    ]
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        until_redis_answers("test", _raise(ResponseError("WRONGTYPE")), sleep=waits.append)
    with pytest.raises(RedisOutage):
        until_redis_answers(
            "test", _raise(ReadOnlyError("READONLY")), sleep=waits.append, give_up_after_s=0
        )


def _raise(error: Exception) -> Any:
    def action() -> None:
        raise error

    return action
