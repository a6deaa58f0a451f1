"""Checkpoint records: named-field JSON objects; the old positional shape is still read."""

from __future__ import annotations

import io
import json

import fakeredis
import pytest

from worker import logs
from worker.coordination import RedisJournal
from worker.loop import (
    JournalEntry,
    LoopState,
    ResponseEntry,
    ToolCallRecord,
    ToolOutcome,
    entry_from_json,
    entry_to_json,
)
from worker.loop._entry_json import _entry_from_version_1
from worker.loop._state import SteerEntry, ToolEntry
from worker.models import Message, ModelResponse, StopReason, ToolCall, Usage
from worker.redis_io import keys as redis_keys

RESPONSE = ResponseEntry(
    step=1,
    response=ModelResponse(
        text="let me look",
        tool_calls=(ToolCall(id="c1", name="hub__search_posts", arguments='{"q":"redis"}'),),
        stop_reason=StopReason.TOOL_USE,
        usage=Usage(input_tokens=50, output_tokens=5, cost_usd=None),
        provider="openai",
        model="gpt-4o-mini",
    ),
)
TOOL = ToolEntry(
    step=1,
    record=ToolCallRecord(
        call_id="c1",
        name="hub__search_posts",
        arguments='{"q":"redis"}',
        server="hub",
        outcome=ToolOutcome.OK,
        is_error=False,
        content="[]",
        duration_s=0.25,
    ),
)
STEER = SteerEntry(text="be brief")
CLOSING = ResponseEntry(
    step=2,
    final=True,
    response=ModelResponse(text="nothing found", usage=Usage(input_tokens=70, output_tokens=3)),
)

# The same entries as the worker wrote them before records had named fields.
VERSION_1 = [
    '{"kind":"response","step":1,"final":false,"text":"let me look",'
    '"tool_calls":[["c1","hub__search_posts","{\\"q\\":\\"redis\\"}"]],"stop_reason":"tool_use",'
    '"usage":[50,5,null],"provider":"openai","model":"gpt-4o-mini"}',
    '{"kind":"tool","step":1,"record":["c1","hub__search_posts","{\\"q\\":\\"redis\\"}","hub",'
    '"ok",false,"[]",0.25]}',
    '{"kind":"steer","text":"be brief"}',
    '{"kind":"response","step":2,"final":true,"text":"nothing found","tool_calls":[],'
    '"stop_reason":"end_turn","usage":[70,3,0.0],"provider":"","model":""}',
]
ENTRIES: list[JournalEntry] = [RESPONSE, TOOL, STEER, CLOSING]


@pytest.mark.parametrize("entry", ENTRIES, ids=["response", "tool", "steer", "closing"])
def test_an_entry_round_trips_through_its_record(entry: JournalEntry) -> None:
    assert entry_from_json(entry_to_json(entry)) == entry


def test_records_are_objects_with_named_fields_a_kind_and_a_version() -> None:
    response, tool, steer, _ = (json.loads(entry_to_json(entry)) for entry in ENTRIES)
    assert (response["kind"], response["version"]) == ("model_response", 2)
    assert response["tool_calls"] == [
        {"id": "c1", "name": "hub__search_posts", "arguments": '{"q":"redis"}'}
    ]
    assert response["usage"] == {
        "input_tokens": 50,
        "output_tokens": 5,
        "cost_usd": None,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert tool["record"] == {
        "call_id": "c1",
        "name": "hub__search_posts",
        "arguments": '{"q":"redis"}',
        "server": "hub",
        "outcome": "ok",
        "is_error": False,
        "content": "[]",
        "duration_s": 0.25,
    }
    assert (tool["kind"], tool["version"]) == ("tool_result", 2)
    assert steer == {"kind": "user_message", "version": 2, "text": "be brief"}


def test_version_1_records_read_as_the_same_entries() -> None:
    assert [entry_from_json(raw) for raw in VERSION_1] == ENTRIES
    assert entry_from_json(VERSION_1[1].encode()) == TOOL  # Redis hands back bytes


def test_a_journal_mixing_both_versions_replays_to_the_same_state(
    redis: fakeredis.FakeRedis,
) -> None:
    key = redis_keys.checkpoint("t-1")
    # An upgrade mid-task: the old worker wrote the first two, the new one the rest.
    redis.rpush(key, VERSION_1[0], VERSION_1[1], entry_to_json(STEER), entry_to_json(CLOSING))
    loaded = RedisJournal(redis, "t-1").load()
    assert loaded == ENTRIES
    state = LoopState(messages=[Message(role="user", content="go")])
    for entry in loaded:
        state.apply(entry)
    assert (state.llm_calls, state.tool_calls, state.iterations) == (2, 1, 1)
    assert state.steps[0].tool_calls[0].outcome is ToolOutcome.OK
    assert state.usage == Usage(input_tokens=120, output_tokens=8, cost_usd=None)


@pytest.mark.parametrize(
    "garbage",
    [
        "not json",
        "[1, 2]",
        "42",
        '{"kind":"mystery","text":"x"}',  # unknown kind, version 1
        '{"kind":"mystery","version":2,"text":"x"}',  # unknown kind, named fields
        '{"kind":"user_message","version":99,"text":"x"}',  # a version this worker does not know
        '{"kind":"steer","version":2,"text":"x"}',  # an old kind with a new version
        '{"kind":"tool_result","version":2,"step":1,"record":["c1"]}',  # new kind, old body
        '{"kind":"tool","step":1,"record":["c1","x"]}',  # old shape, too short
        '{"kind":"tool","step":1,"record":["c1","x","{}","s","bogus",true,"",0]}',
        '{"kind":"response","version":2,"step":1}',  # fields missing
    ],
)
def test_a_record_that_is_no_entry_is_refused(garbage: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        entry_from_json(garbage)


def test_a_corrupt_record_cuts_the_journal_there_and_is_logged(redis: fakeredis.FakeRedis) -> None:
    key = redis_keys.checkpoint("t-1")
    redis.rpush(key, VERSION_1[0], entry_to_json(TOOL), "{garbage", entry_to_json(STEER))
    stream = io.StringIO()
    logs.set_stream(stream)
    try:
        loaded = RedisJournal(redis, "t-1").load()
    finally:
        logs.set_stream(None)
    assert loaded == [RESPONSE, TOOL]
    [line] = [json.loads(raw) for raw in stream.getvalue().splitlines()]
    assert (line["event"], line["task"], line["position"]) == ("checkpoint_corrupt", "t-1", 2)


def test_appended_entries_are_stored_in_the_current_version(redis: fakeredis.FakeRedis) -> None:
    journal = RedisJournal(redis, "t-1")
    for entry in ENTRIES:
        journal.append(entry)
    stored = [json.loads(raw) for raw in redis.lrange(redis_keys.checkpoint("t-1"), 0, -1)]
    assert [record["version"] for record in stored] == [2, 2, 2, 2]
    assert journal.load() == ENTRIES


@pytest.mark.parametrize("entry", ENTRIES, ids=["response", "tool", "steer", "closing"])
def test_a_worker_not_yet_upgraded_refuses_a_new_record_rather_than_misread_it(
    entry: JournalEntry,
) -> None:
    # _entry_from_version_1 reads as the previous release did (it dispatches on the same
    # kinds): in a rolling upgrade an old worker may resume a task a new one checkpointed.
    with pytest.raises((ValueError, KeyError, TypeError)):
        _entry_from_version_1(json.loads(entry_to_json(entry)))
