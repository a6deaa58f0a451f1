"""A command Redis ran whose answer never arrived is sent again: it must count once.

A Redis stopped (a restart, a failover) right after running a command closes the connection
before its answer leaves; the connection's retry (``REDIS_PATIENCE_S``) sends the command again
to the Redis that comes back. The Redis-restart chaos test met it once in 20 runs: the
write caps' reservation for the task's reply ran twice, its second run found the reply
already counted on the post, and the reply was refused ("you already commented on post p-4
in this task"). A step's checkpoint record pushed again the same way would replay the step
twice, and a job's metrics batch would count twice. Here a real redis-server runs each
command, and the connection loses the answer to the command the test arms it for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from worker.coordination import RedisJournal
from worker.hub_writes import WriteCaps, WriteKind, WriteLedger, WriteRefused
from worker.hub_writes._write_caps import Reservation
from worker.loop import ResponseEntry, SteerEntry
from worker.metrics import JobMetrics, apply_job_metrics
from worker.metrics._recorders import WorkerMetrics
from worker.models import ModelResponse, StopReason, ToolCall
from worker.redis_io import keys as redis_keys
from worker.redis_io import patient_redis_retry

pytestmark = pytest.mark.integration

AGENT = "lost-replies-agent"
TASK = "lost-replies-task"


class LosesAnAnswer(redis.Connection):
    """A connection to a real Redis that drops itself after reading the first answer to what
    it sends next with the ``armed`` command in it (a pipeline's too): Redis ran it, the
    client never heard."""

    armed: ClassVar[bytes | None] = None
    lost: ClassVar[int] = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, (bytes, str)) else command
        self._sent = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts)
        super().send_packed_command(command, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        answer = super().read_response(*args, **kwargs)
        armed = LosesAnAnswer.armed
        if armed is not None and b"\r\n" + armed + b"\r\n" in getattr(self, "_sent", b""):
            LosesAnAnswer.armed = None
            LosesAnAnswer.lost += 1
            self.disconnect()
            raise RedisConnectionError("Connection closed by server.")
        return answer


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=LosesAnAnswer)
    connection = redis.Redis(connection_pool=pool)
    connection.set_retry(patient_redis_retry(5))
    LosesAnAnswer.armed, LosesAnAnswer.lost = None, 0
    yield connection
    connection.close()


def ledger(client: redis.Redis) -> WriteLedger:
    caps = WriteCaps(max_daily_comments=10, max_writes_per_post=1, max_responses_per_thread=3)
    return WriteLedger(client, agent_id=AGENT, task_id=TASK, caps=caps)


def comments_today(client: redis.Redis) -> int:
    (day_key,) = client.keys(redis_keys.daily_writes(AGENT, "comment", "*"))
    return int(client.get(day_key) or 0)


def test_a_reservation_whose_answer_was_lost_counts_once_and_the_reply_goes_out(
    client: redis.Redis,
) -> None:
    writes = ledger(client)
    writes.reserve(WriteKind.COMMENT, post_id="p-0")  # loads the script: the next is EVALSHA

    LosesAnAnswer.armed = b"EVALSHA"
    reservation = writes.reserve(WriteKind.COMMENT, post_id="p-1")

    assert LosesAnAnswer.lost == 1  # Redis ran it, the answer was lost, the retry sent it again
    assert isinstance(reservation, Reservation), reservation
    assert comments_today(client) == 2
    assert client.hget(redis_keys.task_post_writes(TASK), "p-1") == b"1"
    assert client.get(redis_keys.thread_writes(AGENT, "p-1")) == b"1"
    # The guard still holds for a second comment on the post, made on purpose.
    second = writes.reserve(WriteKind.COMMENT, post_id="p-1")
    assert isinstance(second, WriteRefused)
    assert second.message.startswith("you already commented on post p-1")


def test_a_refund_whose_answer_was_lost_gives_back_one_write(client: redis.Redis) -> None:
    writes = ledger(client)
    kept = writes.reserve(WriteKind.COMMENT, post_id="p-1")
    refused_by_the_hub = writes.reserve(WriteKind.COMMENT, post_id="p-2")
    assert isinstance(kept, Reservation)
    assert isinstance(refused_by_the_hub, Reservation)

    LosesAnAnswer.armed = b"EVALSHA"
    writes.refund(refused_by_the_hub)
    writes.refund(refused_by_the_hub)  # and a second refund of the same write does nothing

    assert LosesAnAnswer.lost == 1
    assert comments_today(client) == 1
    assert client.hget(redis_keys.task_post_writes(TASK), "p-1") == b"1"
    assert client.hget(redis_keys.task_post_writes(TASK), "p-2") == b"0"
    assert isinstance(writes.reserve(WriteKind.COMMENT, post_id="p-2"), Reservation)


def test_a_checkpoint_record_pushed_again_replays_as_one_step(client: redis.Redis) -> None:
    journal = RedisJournal(client, TASK)
    asked = ResponseEntry(
        step=1,
        response=ModelResponse(
            text="",
            tool_calls=(ToolCall(id="c1", name="hub__get_thread", arguments="{}"),),
            stop_reason=StopReason.TOOL_USE,
        ),
    )
    steer = SteerEntry(text="be brief")
    answered = ResponseEntry(step=2, final=True, response=ModelResponse(text="done"))

    LosesAnAnswer.armed = b"RPUSH"
    journal.append(asked)
    journal.append(steer)
    journal.append(steer)  # the operator said it twice: both stay
    LosesAnAnswer.armed = b"RPUSH"
    journal.append(answered)

    assert LosesAnAnswer.lost == 2
    assert client.llen(redis_keys.checkpoint(TASK)) == 6  # Redis holds each lost one twice
    assert journal.load() == [asked, steer, steer, answered]


def test_a_job_metrics_batch_pushed_again_is_counted_once(client: redis.Redis) -> None:
    in_job = JobMetrics()
    in_job.error_posted()
    LosesAnAnswer.armed = b"RPUSH"
    assert in_job.flush(client, TASK)
    in_job.error_posted()
    assert in_job.flush(client, TASK)

    parent = WorkerMetrics()
    assert apply_job_metrics(client, TASK, metrics=parent)

    assert LosesAnAnswer.lost == 1
    assert parent.registry.get_sample_value("agent_errors_posted_total") == 2
