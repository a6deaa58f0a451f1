"""The CLI gateway's write caps: handed over in the secrets file only, held with the native
loop's CappedToolbox and Redis counters, and told to the worker through the call log."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from mcp_servers.gateway import with_write_caps
from worker.executors._call_log import CallLogWriter, read_call_log
from worker.executors._gateway_link import GatewaySpec
from worker.executors._gateway_secrets import (
    WRITE_CAPS,
    GatewayWriteCaps,
    read_secrets,
    write_secrets_file,
)
from worker.hub_writes import (
    RefusalReason,
    WriteCaps,
    WriteKind,
    WriteLedger,
    WriteRefused,
    counted_refusals,
)
from worker.hub_writes._write_caps import Reservation
from worker.metrics import JobMetrics
from worker.models import ToolSpec
from worker.settings import Settings
from worker.tools import CallContext, Granted, ToolResult
from worker.tools._base import Resolution

REDIS_URL = "redis://:redis-password-for-caps-0123456789@10.0.0.9:6390/3"
CAPS = WriteCaps(max_daily_comments=2, max_writes_per_post=1)


class HubTools:
    """Our hub server's tools as the gateway's McpToolbox offers them: every write is made."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def offered(self) -> Sequence[ToolSpec]:
        return []

    def resolve(self, name: str) -> Resolution:
        spec = ToolSpec(name=name, description="", input_schema={"type": "object"})
        return Granted(spec=spec, server="hub")

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        self.calls.append((name, arguments))
        return ToolResult(content=f"Created comment c-{len(self.calls)} on post p-1.")


def spec(directory: Path) -> GatewaySpec:
    return GatewaySpec(
        agent_id="cli-agent",
        task_id="t-cli",
        mcp_config=directory / "mcp.yaml",
        call_log=directory / "calls.jsonl",
        grants=("hub:*",),
        deadline_epoch_s=time.time() + 60,
    )


def write_caps(caps: WriteCaps = CAPS) -> GatewayWriteCaps:
    settings = Settings(redis_url=REDIS_URL)
    return GatewayWriteCaps.of(settings, caps)


def test_the_caps_and_the_redis_url_travel_in_the_secrets_file_only(tmp_path: Path) -> None:
    handed = write_caps()
    secrets_file = tmp_path / "secrets.json"
    write_secrets_file(secrets_file, {"MCP_AUTH_TOKEN": "token-0123456789", **handed.secrets()})
    gateway_spec = spec(tmp_path)

    with secrets_file.open() as file:
        secrets = read_secrets(file)
    received = GatewayWriteCaps.pop_from(secrets)

    assert received == handed
    assert received.caps == CAPS and received.hub_server == "hub"
    # Taken out: the gateway's environment (which stdio servers inherit from) never has it.
    assert secrets == {"MCP_AUTH_TOKEN": "token-0123456789"}
    assert received.secret_values() == [REDIS_URL, "redis-password-for-caps-0123456789"]
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    assert REDIS_URL not in json.dumps(gateway_spec.environment())
    assert GatewayWriteCaps.pop_from({}) is None
    with pytest.raises(ValueError, match=f"{WRITE_CAPS} in the secrets file is malformed"):
        GatewayWriteCaps.pop_from({WRITE_CAPS: '{"hub_server": "hub"}'})


@pytest.mark.anyio
async def test_the_gateway_holds_the_caps_shared_with_native_tasks_and_tells_the_worker(
    tmp_path: Path, log_stream: Any, redis: fakeredis.FakeRedis
) -> None:
    gateway_spec = spec(tmp_path)
    # A native task of the same agent already wrote one of the two comments of the day.
    native = WriteLedger(redis, agent_id="cli-agent", task_id="t-native", caps=CAPS)
    assert isinstance(native.reserve(WriteKind.COMMENT, post_id="p-9"), Reservation)
    hub = HubTools()
    call_log = CallLogWriter(gateway_spec.call_log)
    toolbox = with_write_caps(hub, gateway_spec, write_caps(), redis, call_log)

    results = [
        await toolbox.call(
            "hub__create_comment",
            {"post_id": post_id, "content": text},
            CallContext(task_id="t-cli", agent_id="cli-agent", step=step, index=0, timeout_s=5),
        )
        for step, (post_id, text) in enumerate(
            [("p-1", "First."), ("p-1", "Again."), ("p-2", "Elsewhere.")], start=1
        )
    ]
    call_log.close()
    activity, _ = read_call_log(gateway_spec.call_log)
    metrics = JobMetrics()
    on_write_refused = counted_refusals(agent_id="cli-agent", task_id="t-cli", metrics=metrics)
    for refusal, via in activity.refusals:
        on_write_refused(refusal, via)

    assert [arguments["content"] for _, arguments in hub.calls] == ["First."]
    assert not results[0].is_error
    # What the CLI's model reads: the native loop's words.
    assert results[1] == ToolResult(
        content="Error: you already commented on post p-1 in this task (limit 1 per post); "
        "do not comment on it again",
        is_error=True,
        refused=True,
    )
    assert results[2] == ToolResult(
        content="Error: daily comment limit (2) reached", is_error=True, refused=True
    )
    assert [(refusal.reason, via) for refusal, via in activity.refusals] == [
        (RefusalReason.PER_POST, "hub__create_comment"),
        (RefusalReason.DAILY_LIMIT, "hub__create_comment"),
    ]
    assert all(isinstance(refusal, WriteRefused) for refusal, _ in activity.refusals)
    batch = metrics._take()
    assert batch is not None
    counters = batch["counters"]
    assert ["agent_hub_writes_refused_total", ["cli-agent", "comment", "per_post"], 1] in counters
    assert [
        "agent_hub_writes_refused_total",
        ["cli-agent", "comment", "daily_limit"],
        1,
    ] in counters
    logged = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    refused = [event for event in logged if event["event"] == "hub_write_refused"]
    assert [(e["task"], e["agent"], e["reason"], e["via"]) for e in refused] == [
        ("t-cli", "cli-agent", "per_post", "hub__create_comment"),
        ("t-cli", "cli-agent", "daily_limit", "hub__create_comment"),
    ]
