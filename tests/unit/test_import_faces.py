"""Package faces load their heavy parts on first use, and the public names still resolve.

``import worker.loop`` (the agent loop, also run by the gateway and the benches) must
not pay for rq, prometheus or the Hub client; ``mcp_servers.gateway`` starts once per
CLI task and must not load the executors, rq, prometheus or Redis (a gateway without
write caps has no Redis to talk to). Each check runs in a fresh interpreter, since
this test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hub_client
import worker
import worker.executors
import worker.models
import worker.tools


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has in sys.modules after ``statement``."""
    probe = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps([m for m in {list(modules)!r} if m in sys.modules]))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded: list[str] = json.loads(completed.stdout.strip().splitlines()[-1])
    return loaded


def test_settings_reach_no_package_above_them() -> None:
    # Every validator runs (a sentinel list, a tool hook, a Redis URL): settings are the
    # lowest layer, so checking them must not load the tools, Redis plumbing or redis-py.
    statement = (
        "import os\n"
        "os.environ.update(REDIS_SENTINELS='127.0.0.1:26379', REDIS_URL='redis://h:6380/1',"
        " CAN_EXECUTE_TOOL='tests.support.tool_checks:refuse_writes')\n"
        "from worker.settings import load_settings\n"
        "load_settings()"
    )
    assert _loaded_after(statement, ("worker.tools", "worker.redis_io", "redis", "rq")) == []


@pytest.mark.parametrize(
    ("statement", "not_loaded"),
    [
        (
            "import worker.loop",
            (
                "rq",
                "prometheus_client",
                "hub_client._client",
                "redis",
                "jwt",
                "mcp",
                "worker.daemon._worker",
                "worker.jobs",
            ),
        ),
        (
            "import worker",
            ("rq", "prometheus_client", "hub_client._client", "redis", "worker.daemon._worker"),
        ),
        (
            "import worker.tools",
            ("jwt", "mcp", "rq", "prometheus_client", "hub_client._client", "worker.tools._mcp"),
        ),
        (
            "import worker.executors",
            ("rq", "prometheus_client", "hub_client._client", "worker.executors._base"),
        ),
        (
            # The rules the worker shares with the Hub client, without the client itself.
            "import hub_client.retry_rules",
            ("hub_client._client", "hub_client._models", "httpx2", "pydantic", "worker"),
        ),
        (
            # The memory server stands on the lowest layers and memory alone.
            "import mcp_servers.memory",
            (
                "rq",
                "prometheus_client",
                "worker.loop",
                "worker.coordination",
                "worker.hub_writes",
                "worker.pipeline",
                "worker.executors",
                "worker.daemon",
            ),
        ),
        (
            "import mcp_servers.gateway",
            (
                "rq",
                "prometheus_client",
                "hub_client._client",
                "worker.daemon._worker",
                "worker.jobs",
                "worker.metrics",
                "worker.agents",
                "worker.executors._base",
                "worker.executors._cli",
                "worker.executors._cli_gateway",
                # Only a task with a capability, write caps, or a stop signal needs these.
                "redis",
                "jwt",
                "pydantic_settings",
                "worker.settings",
                "worker.redis_io._connection",
                "mcp_servers._serving",
            ),
        ),
    ],
)
def test_import_does_not_load_heavy_modules(statement: str, not_loaded: tuple[str, ...]) -> None:
    assert _loaded_after(statement, not_loaded) == []


def test_lazy_names_resolve_to_their_modules() -> None:
    from hub_client._client import HubClient
    from worker.daemon import AgentWorker
    from worker.executors._base import NativeExecutor
    from worker.tools._mcp import McpToolbox

    assert worker.AgentWorker is AgentWorker
    assert worker.tools.McpToolbox is McpToolbox
    assert worker.executors.EXECUTORS["native"] is NativeExecutor
    assert hub_client.HubClient is HubClient
    for face in (hub_client, worker, worker.executors, worker.models, worker.tools):
        for name in face.__all__:
            assert getattr(face, name) is not None, f"{face.__name__}.{name}"


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = worker.nothing_here  # type: ignore[attr-defined]
