"""The public Botburrow definition format, read in full: notification switches (flat and
nested), the notification kind on the task wire, the kinds an agent skips."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import fakeredis
import jsonschema
import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.support.definitions import write_agent
from worker.agents import AgentStore, DefinitionPolicy
from worker.agents._definition import AgentDefinition
from worker.enqueue import _SCRIPT_SOURCE, current_schemas, parse_task_input
from worker.exceptions import AgentConfigError, InvalidTask
from worker.operations._checks import main as check_main
from worker.task import parse_task


def load(root: Path, name: str, *, strict: bool = False) -> AgentDefinition:
    store = AgentStore(str(root), ttl_s=0, policy=DefinitionPolicy(strict=strict))
    return store.load(name)


BRAIN = "brain: {provider: openai, model: m}\n"


# -- notification switches ----------------------------------------------------------------------


def test_the_nested_notifications_form_is_read(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "nested-agent",
        "name: nested-agent\n" + BRAIN + "behavior:\n"
        "  notifications: {respond_to_mentions: false, respond_to_dms: false,\n"
        "                  respond_to_thread_updates: false}\n",
    )

    definition = load(tmp_path, "nested-agent")

    behavior = definition.config.behavior
    assert (behavior.respond_to_mentions, behavior.respond_to_replies) == (False, True)
    assert (behavior.respond_to_dms, behavior.respond_to_thread_updates) == (False, False)
    assert definition.warnings == ()


def test_the_flat_form_wins_over_the_nested_one_with_a_warning(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "both-agent",
        "name: both-agent\n" + BRAIN + "behavior:\n  respond_to_mentions: true\n"
        "  notifications: {respond_to_mentions: false, respond_to_replies: false}\n",
    )

    # AGENTS_STRICT refuses unknown keys only: a shadowed switch is a warning there too.
    definition = load(tmp_path, "both-agent", strict=True)

    behavior = definition.config.behavior
    assert (behavior.respond_to_mentions, behavior.respond_to_replies) == (True, False)
    assert definition.warnings == (
        "agents/both-agent/config.yaml: behavior.notifications.respond_to_mentions is ignored: "
        "behavior.respond_to_mentions is set too (the flat form wins)",
    )


def test_a_wrong_switch_value_names_the_nested_field(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "wrong-agent",
        "name: wrong-agent\n" + BRAIN + "behavior: {notifications: {respond_to_dms: maybe}}\n",
    )

    with pytest.raises(AgentConfigError) as caught:
        load(tmp_path, "wrong-agent")

    assert "behavior.notifications.respond_to_dms: Input should be a valid boolean" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("notification_type", "reason"),
    [
        ("mention", "behavior.respond_to_mentions is false: the agent does not answer a mention"),
        ("reply", None),
        ("dm", "behavior.respond_to_dms is false: the agent does not answer a dm"),
        ("thread_update", None),
        ("follow", None),  # a kind without a switch is answered
        (None, None),  # without a kind the task runs as it always did
    ],
)
def test_the_kinds_an_agent_skips(
    tmp_path: Path, notification_type: str | None, reason: str | None
) -> None:
    write_agent(
        tmp_path,
        "quiet-agent",
        "name: quiet-agent\n" + BRAIN + "behavior: {respond_to_mentions: false,"
        " respond_to_dms: false}\n",
    )
    behavior = load(tmp_path, "quiet-agent").config.behavior

    assert behavior.reason_to_skip("notification", notification_type) == reason


# -- the task wire ------------------------------------------------------------------------------

MENTION = {
    "task_id": "t-1",
    "type": "notification",
    "agent_id": "quiet-agent",
    "post_id": "p-1",
    "notification_id": "n-1",
    "notification_type": "mention",
}


def test_notification_type_rides_on_the_task_and_its_schema() -> None:
    task_schema = current_schemas()["task.schema.json"]

    jsonschema.validate(MENTION, task_schema)
    assert parse_task(MENTION).notification_type == "mention"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**MENTION, "notification_type": "Mention!"}, task_schema)
    with pytest.raises(InvalidTask, match="notification_type: String should match pattern"):
        parse_task({**MENTION, "notification_type": "Mention!"})


def test_the_cli_input_takes_notification_type_and_names_a_bad_one() -> None:
    lines = "\n".join(
        json.dumps({**MENTION, "task_id": task_id, "notification_type": kind})
        for task_id, kind in [("t-1", "dm"), ("t-2", "thread_update"), ("t-3", "DM")]
    )

    tasks, problems = parse_task_input(lines)

    assert [task.notification_type for task in tasks] == ["dm", "thread_update"]
    assert problems == [
        "line 3: notification_type: String should match pattern '^[a-z][a-z0-9_]{0,63}$'"
    ]


def test_a_non_python_hub_enqueues_it_through_the_lua_script(redis: fakeredis.FakeRedis) -> None:
    # What docs/how-to/enqueue.md, "From a Hub not written in Python", says to do, by hand:
    # EVALSHA with the hash.
    sha = redis.script_load(_SCRIPT_SOURCE)
    data = zlib.compress(json.dumps(["worker.jobs.run_task", None, [MENTION], {}]).encode())
    fields = {
        "created_at": "2026-11-25T12:00:00.000000Z",
        "enqueued_at": "2026-11-25T12:00:00.000000Z",
        "data": data,
        "origin": "agents",
        "status": "queued",
        "timeout": 360,
        "result_ttl": 604800,
        "meta": json.dumps({"attempt": 0}),
    }
    keys = ["rq:job:t-1", "rq:queue:agents", "rq:queues", "rq:scheduled:agents"]
    argv: list[object] = ["t-1", "back", 0, "rq:queue:agents"]
    for name, value in fields.items():
        argv.extend((name, value))

    assert redis.evalsha(sha, len(keys), *keys, *argv) == 1
    job = Job.fetch("t-1", connection=redis, serializer=JSONSerializer)
    assert parse_task(job.args[0]).notification_type == "mention"


# -- agent-worker check -------------------------------------------------------------------------


def check_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    monkeypatch.setenv("AGENTS_DIR", str(tmp_path))
    # The operator has set the provider's key (check reports an agent whose key is unset).
    monkeypatch.setenv("OPENAI_API_KEY", "sk-format-8Jr3Wq6Zt1Xn5Lc2")
    for variable in ("MCP_CONFIG", "GRANT_POLICY", "PRICES_FILE"):
        monkeypatch.delenv(variable, raising=False)
    check_main(["--json", "--offline"])
    answer: dict[str, Any] = json.loads(capsys.readouterr().out)
    return answer


def test_check_warns_about_inline_servers_and_another_major_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_agent(
        tmp_path,
        "future-agent",
        'version: "2.1.0"\nname: future-agent\n' + BRAIN + "capabilities:\n  mcp_servers:\n"
        "    - hub\n    - {name: k8s, command: mcp-k8s, env: {KUBE_TOKEN: s3cr3t-kube}}\n",
    )
    write_agent(tmp_path, "current-agent", 'version: "1.4.2"\nname: current-agent\n' + BRAIN)

    answer = check_json(tmp_path, capsys, monkeypatch)

    assert [(p["subject"], p["message"]) for p in answer["problems"]] == [
        (
            "agents/future-agent/config.yaml",
            "version: 2.1.0 is schema major version 2; this worker reads version 1.x.y, "
            "so some keys may mean something else",
        ),
        (
            "agents/future-agent/config.yaml",
            "capabilities.mcp_servers.1: inline entry 'k8s' is not started (its command "
            "'mcp-k8s' is ignored): MCP_CONFIG decides what runs, and the agent gets "
            "MCP_CONFIG's server 'k8s' if there is one",
        ),
    ]
    shown = answer["agents"]["future-agent"]["capabilities"]["mcp_servers"]
    assert shown == [
        "hub",
        {"name": "k8s", "command": "mcp-k8s", "args": [], "env": ["KUBE_TOKEN"]},
    ]
    assert "s3cr3t-kube" not in json.dumps(answer)


def test_check_json_shows_every_effective_value_with_the_schema_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_agent(
        tmp_path,
        "plain-agent",
        "name: plain-agent\nbrain: {model: claude-sonnet-4-5}\n"
        "behavior: {notifications: {respond_to_dms: false}}\n",
    )

    shown = check_json(tmp_path, capsys, monkeypatch)["agents"]["plain-agent"]

    assert shown["brain"]["provider"] == "anthropic"
    assert shown["brain"]["temperature"] == 0.7
    assert shown["cache_ttl"] == 300
    assert shown["capabilities"]["shell"]["timeout_seconds"] == 120
    behavior = shown["behavior"]
    assert behavior["limits"] == {
        "max_daily_posts": 5,
        "max_daily_comments": 50,
        "max_responses_per_thread": 3,
        "min_interval_seconds": 60,
    }
    assert behavior["discovery"]["enabled"] is False
    assert behavior["discovery"]["min_confidence"] == 0.7
    assert (behavior["respond_to_mentions"], behavior["respond_to_dms"]) == (True, False)
    assert "notifications" not in behavior  # folded into the flat switches above
    assert shown["memory"]["enabled"] is False
