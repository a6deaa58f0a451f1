from __future__ import annotations

import io
import json
import time
import zlib
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry, ScheduledJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import utcparse

from tests.support.fake_redis import FakeRedisClients
from worker.enqueue import (
    JOB_FUNCTION,
    REPORT_SCHEMA_FILE,
    TASK_SCHEMA_FILE,
    current_schemas,
    enqueue_cli,
    enqueue_task,
    parse_task_input,
    schema_files,
    write_schemas,
)
from worker.exceptions import InvalidTask
from worker.task import parse_task

NOTIFICATION = {
    "task_id": "t-8c1f",
    "type": "notification",
    "agent_id": "devops-agent",
    "post_id": "p-42",
    "notification_id": "n-7",
    "constraints": {"max_iterations": 5, "max_duration_s": 120},
}
TIMESTAMP_FIELDS = {b"created_at", b"enqueued_at"}


def task(**changes: Any) -> dict[str, Any]:
    return {**NOTIFICATION, **changes}


def job_call(redis: fakeredis.FakeRedis, job_id: str) -> list[Any]:
    raw = redis.hget(f"rq:job:{job_id}", "data")
    assert isinstance(raw, bytes)
    call: list[Any] = json.loads(zlib.decompress(raw))
    return call


def rq_written_hash(rq_redis: fakeredis.FakeRedis, **enqueue_kwargs: Any) -> dict[Any, Any]:
    """What rq 3.0 itself writes for the same job (on another Redis), for comparison."""
    queue = Queue("agents", connection=rq_redis, serializer=JSONSerializer)
    wire = parse_task(NOTIFICATION).model_dump(mode="json", exclude_none=True)
    delay = enqueue_kwargs.pop("delay", None)
    common = {
        "job_id": "t-8c1f",
        "job_timeout": 180,
        "result_ttl": 604800,
        "meta": {"attempt": 0},
        "description": "notification task t-8c1f for devops-agent",
        **enqueue_kwargs,
    }
    if delay is None:
        queue.enqueue(JOB_FUNCTION, wire, **common)
    else:
        queue.enqueue_in(delay, JOB_FUNCTION, wire, **common)
    fields: dict[Any, Any] = rq_redis.hgetall("rq:job:t-8c1f")
    return fields


def test_job_hash_is_the_one_rq_writes_for_a_json_job(
    redis: fakeredis.FakeRedis, fake_redis: FakeRedisClients
) -> None:
    result = enqueue_task(redis, NOTIFICATION)

    assert (result.task_id, result.enqueued, result.status) == ("t-8c1f", True, "enqueued")
    ours: dict[Any, Any] = redis.hgetall("rq:job:t-8c1f")
    theirs = rq_written_hash(fake_redis())
    assert set(ours) == set(theirs)
    for field in set(ours) - TIMESTAMP_FIELDS:
        assert ours[field] == theirs[field], field
    for field in TIMESTAMP_FIELDS:
        utcparse(ours[field].decode())  # rq can read it back
    assert redis.ttl("rq:job:t-8c1f") == -1
    assert redis.smembers("rq:queues") == {b"rq:queue:agents"}


def test_rq_reads_back_the_job_with_the_json_serializer(redis: fakeredis.FakeRedis) -> None:
    enqueue_task(redis, NOTIFICATION, attempt=3)

    job = Job.fetch("t-8c1f", connection=redis, serializer=JSONSerializer)
    assert job.func_name == JOB_FUNCTION
    assert job.args == [parse_task(NOTIFICATION).model_dump(mode="json", exclude_none=True)]
    assert job.kwargs == {}
    assert job.timeout == 180
    assert job.result_ttl == 604800
    assert job.meta == {"attempt": 3}
    assert job.get_status() is JobStatus.QUEUED
    assert job.origin == "agents"


def test_delayed_high_priority_job_matches_rq_enqueue_in(
    redis: fakeredis.FakeRedis, fake_redis: FakeRedisClients
) -> None:
    before = time.time()
    result = enqueue_task(redis, task(priority="high"), delay_s=30)

    assert (result.enqueued, result.status) == (True, "scheduled")
    ours: dict[Any, Any] = redis.hgetall("rq:job:t-8c1f")
    theirs = rq_written_hash(fake_redis(), delay=timedelta(seconds=30), at_front=True)
    assert set(ours) == set(theirs)
    for field in set(ours) - TIMESTAMP_FIELDS:
        if field != b"data":  # the task differs by its priority field only
            assert ours[field] == theirs[field], field
    assert ours[b"status"] == b"scheduled"
    assert ours[b"enqueue_at_front"] == b"1"
    assert redis.llen("rq:queue:agents") == 0
    due = redis.zscore(ScheduledJobRegistry.key_template.format("agents"), "t-8c1f")
    assert due is not None and due >= before + 30


def test_timeout_covers_the_task_deadline_plus_grace(redis: fakeredis.FakeRedis) -> None:
    enqueue_task(redis, task(task_id="short"), timeout_grace_s=30)
    without_deadline = task(task_id="default")
    without_deadline["constraints"] = {}
    enqueue_task(redis, without_deadline)

    assert redis.hget("rq:job:short", "timeout") == b"150"
    assert redis.hget("rq:job:default", "timeout") == b"360"


def test_second_enqueue_of_a_waiting_task_changes_nothing(redis: fakeredis.FakeRedis) -> None:
    first = enqueue_task(redis, NOTIFICATION)
    second = enqueue_task(redis, task(post_id="p-other", priority="high"))

    assert first.status == "enqueued"
    assert (second.enqueued, second.status) == (False, "duplicate")
    assert redis.lrange("rq:queue:agents", 0, -1) == [b"t-8c1f"]
    assert job_call(redis, "t-8c1f")[2][0]["post_id"] == "p-42"


@pytest.mark.parametrize("status", ["queued", "started", "scheduled", "deferred"])
def test_task_in_a_pending_state_is_a_duplicate(redis: fakeredis.FakeRedis, status: str) -> None:
    redis.hset("rq:job:t-8c1f", mapping={"status": status, "data": b"kept"})

    result = enqueue_task(redis, NOTIFICATION)

    assert result.status == "duplicate"
    assert redis.hget("rq:job:t-8c1f", "data") == b"kept"
    assert redis.llen("rq:queue:agents") == 0


def test_a_finished_task_is_a_duplicate_while_its_result_is_kept(
    redis: fakeredis.FakeRedis,
) -> None:
    redis.hset("rq:job:t-8c1f", mapping={"status": "finished", "result_ttl": 604800})
    before = redis.hgetall("rq:job:t-8c1f")

    result = enqueue_task(redis, NOTIFICATION)

    assert (result.status, result.enqueued, result.already_ran) == ("duplicate", False, True)
    assert redis.hgetall("rq:job:t-8c1f") == before
    assert redis.llen("rq:queue:agents") == 0


def test_a_finished_task_is_written_afresh_when_rerun(redis: fakeredis.FakeRedis) -> None:
    finished = FinishedJobRegistry.key_template.format("agents")
    redis.hset(
        "rq:job:t-8c1f",
        mapping={"status": "finished", "exc_info": b"old", "worker_name": "w1", "retries_left": 2},
    )
    redis.expire("rq:job:t-8c1f", 100)
    redis.zadd(finished, {"t-8c1f": time.time() + 100})

    result = enqueue_task(redis, NOTIFICATION, delay_s=30, attempt=2, rerun=True)

    assert result.status == "scheduled" and not result.already_ran
    fields: dict[Any, Any] = redis.hgetall("rq:job:t-8c1f")
    assert b"exc_info" not in fields and b"retries_left" not in fields
    assert fields[b"worker_name"] == b""
    assert json.loads(fields[b"meta"]) == {"attempt": 2}
    assert redis.ttl("rq:job:t-8c1f") == -1
    assert redis.zscore(finished, "t-8c1f") is None


def test_a_producer_without_the_rerun_argument_still_enqueues(
    redis: fakeredis.FakeRedis,
) -> None:
    """A Hub written before ``ARGV[5]`` (the job hash from ``ARGV[5]`` on) keeps working."""
    script = redis.register_script((resources.files("worker") / "enqueue.lua").read_text())
    keys = ["rq:job:old", "rq:queue:agents", "rq:queues", "rq:scheduled:agents"]
    args = ["old", "back", 0, "rq:queue:agents", "status", "queued", "origin", "agents"]

    assert script(keys=keys, args=args) == 1
    assert redis.hgetall("rq:job:old") == {b"status": b"queued", b"origin": b"agents"}
    redis.hset("rq:job:old", "status", "finished")
    assert script(keys=keys, args=args) == 3


def test_high_priority_goes_to_the_front(redis: fakeredis.FakeRedis) -> None:
    enqueue_task(redis, task(task_id="a"))
    enqueue_task(redis, task(task_id="b", priority="low"))
    enqueue_task(redis, task(task_id="urgent", priority="high"))

    # rq pops from the left.
    assert redis.lrange("rq:queue:agents", 0, -1) == [b"urgent", b"a", b"b"]


def test_invalid_task_is_refused_before_redis(redis: fakeredis.FakeRedis) -> None:
    with pytest.raises(InvalidTask, match="post_id is required"):
        enqueue_task(redis, task(post_id=None))

    assert redis.keys("*") == []


def test_input_forms_are_one_object_an_array_or_json_lines() -> None:
    one = json.dumps(NOTIFICATION, indent=2)
    array = json.dumps([task(task_id="a"), task(task_id="b")])
    lines = "\n".join(json.dumps(task(task_id=f"l{n}")) for n in range(3)) + "\n"

    assert [t.task_id for t in parse_task_input(one)[0]] == ["t-8c1f"]
    assert [t.task_id for t in parse_task_input(array)[0]] == ["a", "b"]
    assert [t.task_id for t in parse_task_input(lines)[0]] == ["l0", "l1", "l2"]
    assert parse_task_input(lines)[1] == []


def test_every_invalid_entry_gets_one_problem_line() -> None:
    text = "\n".join(
        [
            json.dumps(task(task_id="ok-1")),
            "",
            json.dumps(task(task_id="no-post", post_id=None)),
            "{not json",
            json.dumps([1, 2]),
            json.dumps(task(task_id="ok-1")),
            json.dumps(task(task_id="bad id!", type="exploration")),
        ]
    )

    tasks, problems = parse_task_input(text)

    assert [t.task_id for t in tasks] == ["ok-1"]
    assert problems[0] == "line 3: post_id is required for notification tasks"
    assert problems[1].startswith("line 4: not valid JSON (")
    assert problems[2] == "line 5: expected a JSON object, got array"
    assert problems[3] == "line 6: task_id ok-1 appears more than once (first at line 1)"
    assert problems[4].startswith("line 7: task_id: String should match pattern")
    assert len(problems) == 5


def test_array_entries_are_named_by_position() -> None:
    _, problems = parse_task_input(json.dumps([NOTIFICATION, {"task_id": "x"}]))

    assert len(problems) == 1
    assert problems[0].startswith("item 2: type: Field required")


def test_empty_input_is_a_problem() -> None:
    assert parse_task_input("  \n") == (
        [],
        ["input is empty: expected a JSON object, a JSON array or JSON lines"],
    )


def test_cli_enqueues_all_and_reports_duplicates(
    redis: fakeredis.FakeRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "tasks.jsonl"
    source.write_text(json.dumps(task(task_id="a")) + "\n" + json.dumps(task(task_id="b")) + "\n")

    assert enqueue_cli(str(source), redis) == 0
    assert capsys.readouterr().out == "enqueued a\nenqueued b\n"
    assert enqueue_cli(str(source), redis) == 0
    assert capsys.readouterr().out == "duplicate a\nduplicate b\n"
    assert redis.lrange("rq:queue:agents", 0, -1) == [b"a", b"b"]


def test_cli_enqueues_nothing_when_any_task_is_invalid(
    redis: fakeredis.FakeRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "tasks.json"
    source.write_text(json.dumps([task(task_id="a"), task(task_id="b", post_id=None)]))

    assert enqueue_cli(str(source), redis) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "item 2: post_id is required for notification tasks\n"
    assert redis.keys("*") == []


def test_cli_reads_stdin(
    redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(NOTIFICATION)))

    assert enqueue_cli("-", redis) == 0
    assert capsys.readouterr().out == "enqueued t-8c1f\n"


def test_cli_names_an_unreadable_file(
    redis: fakeredis.FakeRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.json"

    assert enqueue_cli(str(missing), redis) == 2
    assert capsys.readouterr().err == (
        f"agent-worker enqueue: cannot read {missing}: No such file or directory\n"
    )


def test_shipped_schemas_are_the_models_current_schemas() -> None:
    files = schema_files()

    assert set(files) == {TASK_SCHEMA_FILE, REPORT_SCHEMA_FILE}
    for name, schema in current_schemas().items():
        assert json.loads(files[name].read_text(encoding="utf-8")) == schema, (
            f"{name} is stale: run worker.enqueue.write_schemas(worker.enqueue.SCHEMA_DIR)"
        )


def test_write_schemas_writes_what_is_shipped(tmp_path: Path) -> None:
    written = write_schemas(tmp_path)

    assert sorted(path.name for path in written) == sorted(schema_files())
    for path in written:
        assert path.read_bytes() == schema_files()[path.name].read_bytes()


def test_task_schema_requires_post_id_for_notifications() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(current_schemas()[TASK_SCHEMA_FILE])

    assert validator.is_valid(NOTIFICATION)
    assert not validator.is_valid(task(post_id=None))
    assert validator.is_valid({"task_id": "e-1", "type": "exploration", "agent_id": "abc"})
    assert not validator.is_valid(task(task_id="has space"))
