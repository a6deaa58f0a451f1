"""The bad-input corpus: malformed tasks and hostile inputs, each with what must be said about it.

One row per case. ``put`` writes the case into Redis the way a broken or hostile
producer would (raw job hashes, not our validated enqueue); ``expect`` says where the
failure must show and a fragment of the message that names what is wrong:

- ``Failed``: rq's failed registry holds the job with that reason; ``posted_by`` names
  who must post it to ``m/agent-errors`` (the agent, or ERRORS_AGENT_ID when no agent
  could be loaded; None when rq could not even call run_task).
- ``Refused`` / ``Undecodable``: the worker parent fails the job without running it
  (log events ``job_refused`` / ``job_undecodable``).
- ``ToolError``: the task runs and completes; the failing tool call comes back to the
  model as an error result holding the fragment.
- ``Withdrawn``: the task runs and completes without the server's tools; the worker logs
  ``mcp_server_withdrawn`` for that server with a reason holding the fragment.

A task whose own id is unusable is reported (and posted) under its rq job id, so every
case's error post can be found by the case name.
"""

from __future__ import annotations

import json
import pickle
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests.chaos.harness import AGENT, KIT_AGENT, MODEL, agent_config
from tests.support.definitions import write_agent
from worker.enqueue import JOB_FUNCTION, enqueue_task

ERRORS_AGENT = "agent-worker"  # ERRORS_AGENT_ID's default: posts when no agent could be loaded
JUNK_AGENT = "corpus-junk-agent"


@dataclass(frozen=True)
class Failed:
    fragment: str
    posted_by: str | None = None


@dataclass(frozen=True)
class Refused:
    fragment: str


@dataclass(frozen=True)
class Undecodable:
    fragment: str


@dataclass(frozen=True)
class ToolError:
    fragment: str


@dataclass(frozen=True)
class Withdrawn:
    server: str
    fragment: str


Expectation = Failed | Refused | Undecodable | ToolError | Withdrawn


@dataclass(frozen=True)
class Place:
    """What a case may use to put itself into Redis."""

    connection: redis.Redis
    agents_dir: Path
    post_id: str  # a real post on the Hub
    seed_post: Callable[[str], str]
    set_scenario: Callable[[str, list[dict[str, Any]]], None]


@dataclass(frozen=True)
class BadInput:
    case: str  # the rq job id
    what: str
    put: Callable[[Place, str], None]
    expect: Expectation


# -- how cases reach Redis -------------------------------------------------------------------


def _valid_task(case: str, place: Place, **changes: Any) -> dict[str, Any]:
    task = {"task_id": case, "type": "notification", "agent_id": AGENT, "post_id": place.post_id}
    task.update(changes)
    return task


def _write_job(place: Place, case: str, **fields: bytes | str) -> None:
    """A job hash exactly as our enqueue writes it, then ``fields`` overwritten raw."""
    enqueue_task(place.connection, _valid_task(case, place))
    for name, value in fields.items():
        place.connection.hset(f"rq:job:{case}", name, value)


def _call(function: Any, args: Any, kwargs: Any = None) -> bytes:
    return zlib.compress(json.dumps([function, None, args, kwargs or {}]).encode())


def task(**changes: Any) -> Callable[[Place, str], None]:
    """run_task with our base task changed (a key set to ``DROP`` is removed)."""

    def put(place: Place, case: str) -> None:
        raw = {k: v for k, v in _valid_task(case, place, **changes).items() if v is not DROP}
        _write_job(place, case, data=_call(JOB_FUNCTION, [raw]))

    return put


def task_object(value: Any) -> Callable[[Place, str], None]:
    """run_task called with ``value`` as its one argument."""

    def put(place: Place, case: str) -> None:
        _write_job(place, case, data=_call(JOB_FUNCTION, [value]))

    return put


def call(function: Any, args: Any, kwargs: Any = None) -> Callable[[Place, str], None]:
    """A job calling ``function(*args, **kwargs)``, whatever those are."""

    def put(place: Place, case: str) -> None:
        _write_job(place, case, data=_call(function, args, kwargs))

    return put


def raw_fields(**fields: bytes | str) -> Callable[[Place, str], None]:
    """A valid job with some of its hash fields overwritten byte for byte."""

    def put(place: Place, case: str) -> None:
        _write_job(place, case, **fields)

    return put


def agent_files(
    config: Mapping[str, Any] | str | bytes, *, prompt: bool = True
) -> Callable[[Place, str], None]:
    """An agent named after the case, with this config.yaml, answering the base post."""

    def put(place: Place, case: str) -> None:
        name = case  # case names are valid agent names
        if isinstance(config, bytes):
            write_agent(place.agents_dir, name, "placeholder")
            (place.agents_dir / "agents" / name / "config.yaml").write_bytes(config)
        elif isinstance(config, str):
            write_agent(place.agents_dir, name, config.replace("NAME", name))
        else:
            write_agent(place.agents_dir, name, {**agent_config(name), **config})
        if not prompt:
            (place.agents_dir / "agents" / name / "system-prompt.md").unlink()
        enqueue_task(place.connection, _valid_task(case, place, agent_id=name))

    return put


def tool_call(name: str, arguments: Any, *, agent: str = AGENT) -> Callable[[Place, str], None]:
    """The model calls one tool, then answers; the tool's result is what the case checks."""

    def put(place: Place, case: str) -> None:
        place.set_scenario(
            case,
            [{"tool_calls": [{"name": name, "arguments": arguments}]}, {"text": f"done {case}"}],
        )
        post_id = place.seed_post(f"@{agent} please look [[scenario:{case}]]")
        enqueue_task(place.connection, _valid_task(case, place, agent_id=agent, post_id=post_id))

    return put


DROP = object()
HUGE = "x" * 2_000_000  # 2 MB in one field

W = ERRORS_AGENT  # short, so the table reads as one row per case

# fmt: off
CORPUS: list[BadInput] = [
    # -- the task object: wrong JSON types, missing and unknown fields ----------------------------
    BadInput("bad-task-string", "the task is a JSON string", task_object("do something"),
             Failed("task: Input should be a valid dictionary", W)),
    BadInput("bad-task-list", "the task is a JSON array", task_object([1, 2, 3]),
             Failed("task: Input should be a valid dictionary", W)),
    BadInput("bad-task-null", "the task is null", task_object(None),
             Failed("task: Input should be a valid dictionary", W)),
    BadInput("bad-no-task-id", "task_id missing", task(task_id=DROP),
             Failed("task_id: Field required", W)),
    BadInput("bad-task-id-chars", "task_id with a space and '!'", task(task_id="bad id!"),
             Failed("task_id: String should match pattern", W)),
    BadInput("bad-task-id-number", "task_id is a number", task(task_id=12345),
             Failed("task_id: Input should be a valid string", W)),
    BadInput("bad-type-unknown", "unknown task type", task(type="dream"),
             Failed("type: Input should be 'notification' or 'exploration'", W)),
    BadInput("bad-type-number", "type is a number", task(type=7),
             Failed("type: Input should be 'notification' or 'exploration'", W)),
    BadInput("bad-no-agent", "agent_id missing", task(agent_id=DROP),
             Failed("agent_id: Field required", W)),
    BadInput("bad-agent-id-path", "agent_id climbing out of the definitions tree",
             task(agent_id="../../etc"), Failed("agent_id: String should match pattern", W)),
    BadInput("bad-agent-unknown", "an agent with no definition", task(agent_id="ghost-agent"),
             Failed("unknown agent 'ghost-agent'", W)),
    BadInput("bad-no-post-id", "notification without post_id", task(post_id=DROP),
             Failed("post_id is required for notification tasks", W)),
    BadInput("bad-post-missing", "a post the Hub does not have", task(post_id="p-404"),
             Failed("post 'p-404' of task bad-post-missing does not exist on the Hub", AGENT)),
    BadInput("bad-unknown-field", "unknown top-level field", task(run_as="root"),
             Failed("run_as: Extra inputs are not permitted", W)),
    BadInput("bad-priority", "priority outside high/normal/low", task(priority="urgent"),
             Failed("priority: Input should be 'high', 'normal' or 'low'", W)),
    BadInput("bad-constraints-type", "constraints is a string", task(constraints="fast"),
             Failed("constraints: Input should be a valid dictionary", W)),
    BadInput("bad-constraints-field", "unknown constraint", task(constraints={"sudo": True}),
             Failed("constraints.sudo: Extra inputs are not permitted", W)),
    BadInput("bad-max-iterations", "max_iterations out of range",
             task(constraints={"max_iterations": 10_000}),
             Failed("constraints.max_iterations: Input should be less than or equal to 50", W)),
    BadInput("bad-negative-deadline", "negative max_duration_s",
             task(constraints={"max_duration_s": -5}),
             Failed("constraints.max_duration_s: Input should be greater than 0", W)),
    BadInput("bad-tools-type", "allowed_tools is not a list",
             task(constraints={"allowed_tools": "hub__create_post"}),
             Failed("constraints.allowed_tools: Input should be a valid list", W)),
    # -- oversized fields ---------------------------------------------------------------------
    BadInput("bad-huge-post-id", "post_id of 2 MB", task(post_id=HUGE),
             Failed("post_id: String should have at most 256 characters", W)),
    BadInput("bad-huge-notification", "notification_id of 2 MB", task(notification_id=HUGE),
             Failed("notification_id: String should have at most 256 characters", W)),
    BadInput("bad-many-tools", "20,000 allowed tools",
             task(constraints={"allowed_tools": ["hub__search_posts"] * 20_000}),
             Failed("constraints.allowed_tools: List should have at most 500 items", W)),
    # -- the call rq would make ---------------------------------------------------------------
    BadInput("bad-no-argument", "run_task called without the task", call(JOB_FUNCTION, []),
             Failed("run_task() missing 1 required positional argument: 'task'")),
    BadInput("bad-two-arguments", "run_task called with two tasks",
             call(JOB_FUNCTION, [{"task_id": "a"}, {"task_id": "b"}]),
             Failed("run_task() takes 1 positional argument but 2 were given")),
    BadInput("bad-foreign-function", "a job naming os.system", call("os.system", ["id"]),
             Refused("job function 'os.system' is not allowed")),
    BadInput("bad-foreign-module", "a function of a module nobody installed",
             call("evil.module.run", []), Refused("job function 'evil.module.run' is not allowed")),
    BadInput("bad-function-type", "the function name is a number", call(42, []),
             Refused("job function 42 is not allowed")),
    BadInput("bad-callback", "a failure callback naming os.system",
             raw_fields(failure_callback_name="os.system"),
             Refused("job failure_callback_name 'os.system' is not allowed")),
    BadInput("bad-args-type", "args is an object, not a list",
             raw_fields(data=_call(JOB_FUNCTION, {"a": 1})),
             Undecodable("job arguments cannot be decoded: args must be a list")),
    # -- job hashes that are not JSON, or not UTF-8 -------------------------------------------
    BadInput("bad-data-bytes", "job data: random non-UTF-8 bytes",
             raw_fields(data=b"\x00\xff\xfe garbage \x80\x81"),
             Undecodable("job data cannot be decoded")),
    BadInput("bad-data-utf8-in-json", "a JSON call with a non-UTF-8 byte in a string",
             raw_fields(data=zlib.compress(b'["worker.jobs.run_task", null, [{"a": "\xff"}], {}]')),
             Undecodable("job data cannot be decoded")),
    BadInput("bad-data-pickle", "job data pickled (rq's default serializer)",
             raw_fields(data=zlib.compress(pickle.dumps((JOB_FUNCTION, None, [{}], {})))),
             Undecodable("only jobs written with rq.serializers.JSONSerializer")),
    BadInput("bad-data-json-object", "job data: a JSON object, not a call",
             raw_fields(data=zlib.compress(b'{"function": "worker.jobs.run_task"}')),
             Undecodable("job data cannot be decoded")),
    BadInput("bad-meta-bytes", "job meta: non-UTF-8 bytes", raw_fields(meta=b"\xff\xfe\x00"),
             Undecodable("job meta cannot be decoded: it must be a JSON object")),
    BadInput("bad-meta-list", "job meta: a JSON array", raw_fields(meta=b"[1, 2]"),
             Undecodable("job meta cannot be decoded: it must be a JSON object")),
    BadInput("bad-created-at", "created_at is not a date", raw_fields(created_at="yesterday"),
             Undecodable("job hash cannot be loaded by rq")),
    # -- agent definitions with bad values ----------------------------------------------------
    BadInput("bad-agent-temperature", "brain.temperature of 7",
             agent_files({"brain": {"provider": "openai", "model": MODEL, "temperature": 7}}),
             Failed("config.yaml: brain.temperature: Input should be less than or equal to 2", W)),
    BadInput("bad-agent-iterations", "behavior.max_iterations is a word",
             agent_files({"behavior": {"max_iterations": "lots"}}),
             Failed("config.yaml: behavior.max_iterations: Input should be a valid integer", W)),
    BadInput("bad-agent-provider", "brain.provider nobody knows",
             agent_files({"brain": {"provider": "skynet", "model": MODEL}}),
             Failed("config.yaml: brain.provider: Input should be 'anthropic' or 'openai'", W)),
    BadInput("bad-agent-grant", "a grant that is not svc:scope",
             agent_files({"capabilities": {"grants": ["all of them"]}}),
             Failed("config.yaml: capabilities.grants.0: String should match pattern", W)),
    BadInput("bad-agent-steals-key", "brain.api_key_env naming the worker's Hub key",
             agent_files({"brain": {"provider": "openai", "model": MODEL,
                                    "api_key_env": "HUB_API_KEY"}}),
             Failed("brain.api_key_env: HUB_API_KEY is the worker's own secret", W)),
    BadInput("bad-agent-yaml", "config.yaml that is not YAML",
             agent_files("name: NAME\nbrain: [unclosed\n"),
             Failed("config.yaml: invalid YAML at line 3, column 1", W)),
    BadInput("bad-agent-not-utf8", "config.yaml in Latin-1", agent_files(b"name: caf\xe9\n"),
             Failed("config.yaml: not valid UTF-8", W)),
    BadInput("bad-agent-name", "config.yaml naming another agent",
             agent_files("name: someone-else\nbrain: {provider: openai, model: m}\n"),
             Failed("name: 'someone-else' must equal its directory name", W)),
    BadInput("bad-agent-no-prompt", "an agent without system-prompt.md",
             agent_files({}, prompt=False), Failed("system-prompt.md: not found", W)),
    # -- tools: arguments, outputs and servers ------------------------------------------------
    BadInput("bad-tool-args-json", "tool arguments that are not JSON",
             tool_call("hub__create_post", '{"content": "unterminated'),
             ToolError("arguments for tool 'hub__create_post' are not valid JSON")),
    BadInput("bad-tool-args-schema", "tool arguments of the wrong type",
             tool_call("hub__create_post", {"content": 42}),
             ToolError("invalid arguments for tool 'hub__create_post': content: 42 is not of")),
    BadInput("bad-tool-unknown", "a tool nobody offers", tool_call("hub__drop_database", {}),
             ToolError("Error: Unknown tool 'hub__drop_database'")),
    BadInput("bad-tool-long-output", "a tool answering 1 MB",
             tool_call("kit__huge", {"megabytes": 1}, agent=KIT_AGENT),
             ToolError("[truncated: 1028576 of 1048576 characters omitted]")),
    BadInput("bad-tool-huge-output", "a tool answering 5 MB, over MCP_RESULT_MAX_BYTES",
             tool_call("kit__huge", {"megabytes": 5}, agent=KIT_AGENT),
             ToolError("result larger than 4000000 bytes (MCP_RESULT_MAX_BYTES)")),
    BadInput("bad-tool-garbage-server", "an MCP server answering garbage",
             tool_call("hub__search_posts", {"query": "still works"}, agent=JUNK_AGENT),
             Withdrawn("junk", "Failed to parse JSON response")),
]
# fmt: on


def write_corpus_agents(agents_dir: Path) -> None:
    """The agent of the garbage-server case: the Hub's tools, and the junk server's."""
    write_agent(
        agents_dir,
        JUNK_AGENT,
        agent_config(
            JUNK_AGENT,
            capabilities={"grants": ["hub:read", "junk:use"], "mcp_servers": ["hub", "junk"]},
        ),
    )
