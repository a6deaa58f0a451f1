"""Operator settings: HUB_URL and REDIS_URL are checked, METRICS_HOST, BUDGET_UNREACHABLE."""

from __future__ import annotations

import io
import json

import fakeredis
import pytest

from tests.support.pipeline import Harness
from worker.exceptions import ConfigurationError
from worker.models._scripted import Turn
from worker.settings import Settings, load_settings
from worker.task import Outcome

BUDGET_PATH = "/api/v1/system/budget-health"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HUB_URL", "not-a-url", "invalid setting HUB_URL: must be an http(s) URL"),
        ("HUB_URL", "ftp://hub", "invalid setting HUB_URL: must be an http(s) URL"),
        ("REDIS_URL", "http://x", "invalid setting REDIS_URL: must start with redis://"),
        ("BUDGET_UNREACHABLE", "maybe", "invalid setting BUDGET_UNREACHABLE: Input should be"),
        ("METRICS_HOST", "", "invalid setting METRICS_HOST:"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as error:
        load_settings()
    assert error.value.message.startswith(message)
    assert "\n" not in error.value.message


def test_a_redis_url_password_is_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "http://user:s3cret-pass@redis.internal:6379/0")
    with pytest.raises(ConfigurationError) as error:
        load_settings()
    assert "s3cret-pass" not in error.value.message
    assert "redis.internal" in error.value.message


def test_defaults_keep_earlier_behaviour() -> None:
    config = Settings()
    assert config.metrics_host == "0.0.0.0"
    assert config.budget_unreachable == "run"
    assert config.agents_dir == "."
    assert Settings(budget_unreachable="REFUSE").budget_unreachable == "refuse"  # type: ignore[arg-type]


async def budget_endpoint_down(harness: Harness) -> None:
    await harness.dev("faults", {"status": 503, "count": 1000, "path_prefix": BUDGET_PATH})


@pytest.mark.anyio
async def test_unreachable_budget_runs_the_task_by_default_and_counts_it(
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="Explored.")], redis=redis)
    await budget_endpoint_down(h)
    verdict = await h.run({"task_id": "b-1", "type": "exploration", "agent_id": "demo-agent"})
    assert verdict.report.outcome is Outcome.COMPLETED
    counters = {(name, tuple(labels)): value for name, labels, value in counted(h)}
    assert counters[("agent_budget_check_unreachable_total", ("demo-agent",))] == 1


@pytest.mark.anyio
async def test_budget_unreachable_refuse_requeues_before_any_llm_call(
    log_stream: io.StringIO,
    redis: fakeredis.FakeRedis,
) -> None:
    h = Harness([Turn(text="never")], redis=redis)
    h.settings = h.settings.model_copy(update={"budget_unreachable": "refuse"})
    await budget_endpoint_down(h)
    verdict = await h.run({"task_id": "b-2", "type": "exploration", "agent_id": "demo-agent"})
    assert verdict.report.outcome is Outcome.REQUEUED
    assert verdict.requeue is not None and verdict.requeue["attempt"] == 1
    assert h.model.requests == []
    assert verdict.report.error is not None and verdict.report.error.class_ == "HubUnavailable"
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    (requeued,) = [event for event in events if event["event"] == "task_requeued"]
    assert "BUDGET_UNREACHABLE=refuse" in requeued["reason"]


def counted(harness: Harness) -> list[tuple[str, list[str], float]]:
    batch = harness.metrics._take() or {}
    return [tuple(entry) for entry in batch.get("counters", [])]  # type: ignore[misc]
