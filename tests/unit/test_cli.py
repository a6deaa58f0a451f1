"""The CLI's pieces on fakeredis: --redis-url, report, requeue --all, unknown ids, --version."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from worker.daemon._logging import _one_line_task_failure
from worker.enqueue import enqueue_task
from worker.operations import _cli as cli
from worker.operations._repairs import failed_task_ids, requeue_failed
from worker.operations._reports import StoredReport, find_report, render_report
from worker.operations._status import collect_status
from worker.redis_io import CappedJob
from worker.settings import settings

REPORT: dict[str, Any] = {
    "task_id": "t-1",
    "agent_id": "demo-agent",
    "type": "notification",
    "outcome": "completed",
    "output": "Scale out with more workers.\nOne queue is enough.",
    "iterations": 2,
    "llm_calls": 2,
    "tool_calls": 1,
    "tokens_input": 1200,
    "tokens_output": 80,
    "cost_usd": None,
    "duration_s": 3.2,
    "posted": ["c-1"],
    "error": None,
}
TASK = {"task_id": "t-1", "type": "exploration", "agent_id": "demo-agent"}


@pytest.fixture
def clean_redis_url() -> Iterator[None]:
    before = os.environ.get("REDIS_URL")
    yield
    if before is None:
        os.environ.pop("REDIS_URL", None)
    else:
        os.environ["REDIS_URL"] = before
    settings.cache_clear()


def fail(redis: fakeredis.FakeRedis, task: dict[str, Any], *, report: bool = True) -> None:
    enqueue_task(redis, task)
    job = Job.fetch(task["task_id"], connection=redis, serializer=JSONSerializer)
    if report:
        job.meta["report"] = {**REPORT, "task_id": task["task_id"], "outcome": "error"}
        job.save_meta()
    queue = Queue("agents", connection=redis, serializer=JSONSerializer)
    queue.remove(job.id)
    job.set_status("failed")
    queue.failed_job_registry.add(job, ttl=3600, exc_string="TaskFailed: boom")


@pytest.mark.usefixtures("clean_redis_url")
@pytest.mark.parametrize(
    ("arguments", "kept"),
    [
        (["status", "--redis-url", "redis://h:1/2", "--json"], ["status", "--json"]),
        (["--redis-url=redis://h:1/2", "report", "t-1"], ["report", "t-1"]),
        (["cancel", "t-1", "--redis-url", "redis://h:1/2"], ["cancel", "t-1"]),
    ],
)
def test_redis_url_is_taken_from_any_position(arguments: list[str], kept: list[str]) -> None:
    assert cli._take_redis_url(arguments) == kept
    assert os.environ["REDIS_URL"] == "redis://h:1/2"
    assert settings().redis_url == "redis://h:1/2"


def test_redis_url_without_a_value_is_one_line() -> None:
    with pytest.raises(SystemExit, match="--redis-url needs a URL"):
        cli._take_redis_url(["status", "--redis-url"])


@pytest.mark.parametrize(
    "command",
    sorted({"enqueue", "cancel", "steer", *(name for name, *_ in cli.EXTENSIONS)} - cli._NO_REDIS),
)
def test_every_redis_subcommand_lists_redis_url_in_its_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    assert "--redis-url URL" in capsys.readouterr().out


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "agent-worker 0.1.0"


@pytest.mark.parametrize("command", [["cancel", "t-nobody"], ["steer", "t-nobody", "hello"]])
def test_cancel_and_steer_of_an_unknown_task_exit_2_and_record_nothing(
    redis: fakeredis.FakeRedis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    monkeypatch.setattr(cli, "_redis", lambda: redis)
    assert cli.main(command) == 2
    assert capsys.readouterr().err.strip() == (
        f"agent-worker {command[0]}: 't-nobody': unknown task "
        "(no job with this id; it may have expired)"
    )
    assert redis.keys("*") == []


def test_cancel_of_a_queued_task_still_works(
    redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_redis", lambda: redis)
    enqueue_task(redis, TASK)
    assert cli.main(["cancel", "t-1"]) == 0
    assert "removed from the queue" in capsys.readouterr().out


def test_find_report_explains_every_missing_case(redis: fakeredis.FakeRedis) -> None:
    assert "not a task id" in str(find_report(redis, "../x"))
    assert find_report(redis, "t-9") == (
        "t-9: unknown task (no job with this id; it may have expired)"
    )
    enqueue_task(redis, TASK)
    assert find_report(redis, "t-1") == "t-1: no report yet (status queued)"
    job = Job.fetch("t-1", connection=redis, serializer=JSONSerializer)
    job.meta["report"] = REPORT
    job.save_meta()
    found = find_report(redis, "t-1")
    assert isinstance(found, StoredReport) and found.report == REPORT


def test_render_report_reads_as_text() -> None:
    text = render_report(StoredReport(report=REPORT, job_status="finished", ended_at=None))
    assert text.splitlines() == [
        "task t-1 (notification, agent demo-agent): completed",
        "  rq job: finished",
        "  iterations 2, llm calls 2, tool calls 1",
        "  tokens 1200 in / 80 out (0 in read from the prompt cache, 0 written to it), "
        "cost unknown, 3.2 s",
        "  posted: c-1",
        "output:",
        "  Scale out with more workers.",
        "  One queue is enough.",
    ]
    failed = {**REPORT, "error": {"class": "AgentConfigError", "message": "x.yaml: bad"}}
    text = render_report(StoredReport(report=failed, job_status="failed", ended_at=None))
    assert "  error: AgentConfigError: x.yaml: bad" in text.splitlines()


def test_requeue_all_takes_every_failed_task_and_skips_the_unreadable(
    redis: fakeredis.FakeRedis,
) -> None:
    for task_id in ("t-1", "t-2"):
        fail(redis, {**TASK, "task_id": task_id})
    redis.zadd("rq:failed:agents", {"t-gone": 9_999_999_999})  # its job hash expired
    ids = failed_task_ids(redis)
    assert sorted(ids) == ["t-1", "t-2", "t-gone"]
    outcome = requeue_failed(redis, ids, skip_refused=True)
    assert sorted(r.task_id for r in outcome.requeued) == ["t-1", "t-2"]
    assert outcome.refusals == ["t-gone: unknown task (no job with this id; it may have expired)"]
    assert sorted(failed_task_ids(redis)) == ["t-gone"]
    # Without skip_refused it stays all or nothing.
    fail(redis, {**TASK, "task_id": "t-3"})
    outcome = requeue_failed(redis, ["t-3", "t-gone"])
    assert outcome.requeued == [] and len(outcome.refusals) == 1


@pytest.mark.parametrize("field", ["data", "exc_info"])
def test_a_zlib_bomb_in_a_job_hash_is_unreadable_to_status_requeue_and_report(
    redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    monkeypatch.setattr(CappedJob, "max_data_bytes", 65_536)
    fail(redis, TASK)
    # A kilobyte in Redis that expands to sixteen times the cap once decompressed.
    redis.hset(Job.key_for("t-1"), field, zlib.compress(b"\0" * 1_048_576))

    assert find_report(redis, "t-1") == "t-1: its job data cannot be read"
    refused = requeue_failed(redis, ["t-1"])
    assert refused.requeued == []
    assert refused.refusals == ["t-1: its job data cannot be read"]
    [failure] = collect_status(redis).recent_failures
    assert failure.task_id == "t-1" and failure.agent_id is None and failure.outcome is None


def test_rq_log_of_a_failed_task_is_one_line() -> None:
    message = (
        "Worker w1: job t-1: exception raised while executing (worker.jobs.run_task)\n"
        "Traceback (most recent call last):\n"
        '  File "rq/worker/base.py", line 1671, in perform_job\n'
        "    return_value = job.perform()\n"
        "worker.exceptions.TaskFailed: task t-1 error: AgentConfigError: a.yaml: bad\n"
    )
    assert _one_line_task_failure(message) == (
        "Worker w1: job t-1: exception raised while executing (worker.jobs.run_task) "
        "TaskFailed: task t-1 error: AgentConfigError: a.yaml: bad"
    )
    bug = message.replace("worker.exceptions.TaskFailed", "KeyError")
    assert _one_line_task_failure(bug) == bug  # a real bug keeps its frames
