"""The bad-input corpus (bad_input_corpus.CORPUS) in one burst worker run: each case fails
alone, with a reason naming what is wrong, and the worker serves the good task after them."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from tests.chaos.bad_input_corpus import (
    CORPUS,
    BadInput,
    Failed,
    Place,
    Refused,
    ToolError,
    Undecodable,
    Withdrawn,
    write_corpus_agents,
)
from tests.chaos.harness import AGENT, ChaosStack, WorkerProcess

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def test_corpus_is_large_and_every_case_is_named_once() -> None:
    cases = [row.case for row in CORPUS]
    assert len(cases) >= 30
    assert len(set(cases)) == len(cases)


def tool_results(chaos: ChaosStack, case: str) -> list[str]:
    """What the model was told about its tool calls, in the requests of this case."""
    return [
        str(message.get("content"))
        for request in chaos.llm.requests(case)
        for message in request["body"]["messages"]
        if message.get("role") == "tool"
    ]


def problems_with(chaos: ChaosStack, row: BadInput, worker: WorkerProcess) -> list[str]:
    """What is wrong with how the worker handled one case (nothing: an empty list)."""
    runs = [event for event in worker.events("task_started") if event["task"] == row.case]
    found = [] if len(runs) <= 1 else [f"ran {len(runs)} times"]
    expect = row.expect
    if isinstance(expect, Withdrawn):
        return found + withdrawal_problems(chaos, row.case, expect, worker)
    if isinstance(expect, ToolError):
        return found + tool_error_problems(chaos, row.case, expect)
    return found + failure_problems(chaos, row.case, expect, worker)


def withdrawal_problems(
    chaos: ChaosStack, case: str, expect: Withdrawn, worker: WorkerProcess
) -> list[str]:
    found = [] if (status := chaos.status(case)) == "finished" else [f"status {status}"]
    withdrawn = [
        event["reason"]
        for event in worker.events("mcp_server_withdrawn")
        if event["server"] == expect.server and expect.fragment in event["reason"]
    ]
    if not withdrawn:
        found.append(f"no mcp_server_withdrawn for {expect.server} with {expect.fragment!r}")
    offered = [
        tool["function"]["name"]
        for request in chaos.llm.requests(case)
        for tool in request["body"].get("tools", [])
    ]
    if not offered or any(name.startswith(expect.server + "__") for name in offered):
        found.append(f"offered tools {offered}")
    return found


def tool_error_problems(chaos: ChaosStack, case: str, expect: ToolError) -> list[str]:
    if (status := chaos.status(case)) != "finished":
        return [f"status {status}, expected finished"]
    results = tool_results(chaos, case)
    if not any(expect.fragment in result for result in results):
        return [f"no tool result with {expect.fragment!r}: {[r[:300] for r in results]}"]
    return []


def failure_problems(
    chaos: ChaosStack, case: str, expect: Failed | Refused | Undecodable, worker: WorkerProcess
) -> list[str]:
    found = [] if (status := chaos.status(case)) == "failed" else [f"status {status}"]
    reason = chaos.failure_reason(case)
    if expect.fragment not in reason:
        found.append(f"reason lacks {expect.fragment!r}: {reason[-400:]!r}")
    if isinstance(expect, Refused | Undecodable):
        event = "job_refused" if isinstance(expect, Refused) else "job_undecodable"
        if case not in {e["job_id"] for e in worker.events(event)}:
            found.append(f"no {event} event")
    if isinstance(expect, Failed) and expect.posted_by is not None:
        posts = chaos.error_posts_about(case)
        if [post["author"]["id"] for post in posts] != [expect.posted_by]:
            found.append(f"m/agent-errors posts {[(p['author']['id'], p['title']) for p in posts]}")
    return found


def test_every_bad_input_fails_alone_and_the_worker_serves_the_next_task(
    chaos: ChaosStack,
) -> None:
    write_corpus_agents(chaos.agents_dir)
    chaos.llm.set_scenario("corpus-base", [])
    with contextlib.closing(chaos.connection()) as connection:
        place = Place(
            connection=connection,
            agents_dir=chaos.agents_dir,
            post_id=chaos.seed_post(f"@{AGENT} a plain question [[scenario:corpus-base]]"),
            seed_post=chaos.seed_post,
            set_scenario=chaos.llm.set_scenario,
        )
        for row in CORPUS:
            row.put(place, row.case)
    good = chaos.notification("after-corpus", [{"text": "Still serving"}])
    metrics_file = chaos.workdir / "corpus-metrics.prom"

    worker = chaos.run_burst(timeout_s=240, METRICS_TEXTFILE=str(metrics_file))

    assert worker.process.returncode == 0, worker.stderr[-3000:]
    table: dict[str, Any] = {}
    for row in CORPUS:
        found = problems_with(chaos, row, worker)
        if found:
            table[row.case] = found
    assert table == {}, "\n".join(f"{case}: {found}" for case, found in table.items())
    # No error post was swallowed as a replay of another's (shared idempotency keys).
    assert chaos.hub_state()["replays"] == 0
    assert chaos.report(good)["outcome"] == "completed"
    post_id = chaos.job(good).args[0]["post_id"]
    assert [r["content"] for r in chaos.replies_to(post_id)] == ["Still serving"]
    undecodable_rows = [row for row in CORPUS if isinstance(row.expect, Undecodable)]
    assert (
        f"agent_jobs_undecodable_total {float(len(undecodable_rows))}" in metrics_file.read_text()
    )
