"""The dashboard's counting panels and the failure-ratio alert, in a real Prometheus scraping
``agent-worker pool`` through a workload with failures.

Debian's ``prometheus`` server runs on a free loopback port with its own data directory,
scrapes the pool every second and evaluates ``deploy/prometheus/alerts.yml``. Every series
labelled by agent, type and outcome is born during the workload, at its first task, as in a
fleet: the queries must count that first task (``increase()`` alone cannot see it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from tests.chaos.harness import AGENT, MODEL, READER, ChaosStack, unique
from tests.support.promtool import (
    DASHBOARD,
    PROMETHEUS_DIR,
    PROMETHEUS_MISSING,
    find_prometheus,
    substituted,
)
from tests.support.redis_server import free_port
from tests.support.workers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

# 1,000 input and 200 output tokens at 3 and 15 USD per million: 0.006 USD a task.
PRICES = {"models": {MODEL: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}}
ANSWER = {"text": "Done.", "usage": {"input_tokens": 1000, "output_tokens": 200}}
REFUSED = {"status": 401, "error": {"message": "invalid api key"}}


@dataclass
class Prometheus:
    url: str

    def ready(self) -> bool:
        try:
            response = httpx2.get(f"{self.url}/-/ready", timeout=10, trust_env=False)
        except httpx2.TransportError:
            return False
        return response.status_code == 200

    def query(self, expression: str) -> list[dict[str, Any]]:
        response = httpx2.get(
            f"{self.url}/api/v1/query", params={"query": expression}, timeout=10, trust_env=False
        )
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def value(self, expression: str) -> float | None:
        """The value of a query that answers one sample; None when it answers none."""
        result = self.query(expression)
        assert len(result) <= 1, f"{expression!r} answered {result}"
        return float(result[0]["value"][1]) if result else None

    def rule(self, name: str) -> dict[str, Any]:
        response = httpx2.get(f"{self.url}/api/v1/rules", timeout=10, trust_env=False)
        response.raise_for_status()
        for group in response.json()["data"]["groups"]:
            for rule in group["rules"]:
                if rule["name"] == name:
                    return dict(rule)
        raise AssertionError(f"no rule {name}")


@contextmanager
def running_prometheus(binary: str, workdir: Path, target: str) -> Iterator[Prometheus]:
    """``prometheus`` scraping ``target`` (job agent-worker) and evaluating the shipped
    alerts every second; stopped when the block ends."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS_DIR / "alerts.yml")],
        "scrape_configs": [{"job_name": "agent-worker", "static_configs": [{"targets": [target]}]}],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={address}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        prometheus = Prometheus(f"http://{address}")
        wait_until(prometheus.ready, 60, f"prometheus to serve (log: {workdir}/prometheus.log)")
        wait_until(lambda: prometheus.value('up{job="agent-worker"} == 1'), 60, "a scrape")
        yield prometheus
    finally:
        process.terminate()
        process.wait(timeout=30)


def dashboard_query(title: str) -> str:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (target,) = next(panel for panel in panels if panel["title"] == title)["targets"]
    return substituted(str(target["expr"]))


def enqueue(chaos: ChaosStack, agent: str, turns: Sequence[Mapping[str, Any]]) -> str:
    task_id = unique("prom")
    chaos.llm.set_scenario(task_id, turns)
    post_id = chaos.seed_post(f"@{agent} can you help? [[scenario:{task_id}]]")
    task = {"task_id": task_id, "type": "notification", "agent_id": agent, "post_id": post_id}
    assert chaos.enqueue(task) == "enqueued"
    return task_id


def test_a_real_prometheus_counts_each_series_first_task_on_the_panels_and_the_alert(
    chaos: ChaosStack, tmp_path: Path
) -> None:
    binary = find_prometheus()
    if binary is None:
        pytest.skip(PROMETHEUS_MISSING)
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump(PRICES))
    port = free_port()
    chaos.start_pool(
        "--processes", "1", "--concurrency", "4", METRICS_PORT=str(port), PRICES_FILE=str(prices)
    )
    with running_prometheus(binary, tmp_path, f"127.0.0.1:{port}") as prometheus:
        # 40 tasks, 6 failing: a refused model call for each agent, tasks for an agent that
        # is not deployed; every series (agent, type, outcome) is born during the workload.
        tasks = [enqueue(chaos, agent, [ANSWER]) for agent in (AGENT, READER) for _ in range(17)]
        tasks += [enqueue(chaos, agent, [REFUSED]) for agent in (AGENT, READER) for _ in range(2)]
        tasks += [enqueue(chaos, "not-deployed", [ANSWER]) for _ in range(2)]
        reports = [chaos.wait_for_outcome(task_id) for task_id in tasks]
        outcomes = [report["outcome"] for report in reports]
        assert sorted(set(outcomes)) == ["completed", "invalid_task", "model_error"]
        assert outcomes.count("completed") == 34
        cost = sum(report["cost_usd"] or 0.0 for report in reports)
        assert cost == pytest.approx(34 * 0.006)
        wait_until(lambda: prometheus.value("sum(agent_tasks_total) == 40"), 60, "40 tasks scraped")

        # Read as Grafana reads them, until every series' last sample is in (one scrape a
        # second). increase() alone read 0.129 and 0.179 of 0.204 USD here.
        expected = {"Failure ratio (1h)": 6 / 40, "Cost (24h)": cost}

        def panels() -> dict[str, float | None]:
            return {title: prometheus.value(dashboard_query(title)) for title in expected}

        wait_until(lambda: panels() == pytest.approx(expected), 30, f"the panels at {expected}")

        # Pending: the ratio is over its threshold; it fires once that lasted 10 minutes.
        def pending() -> dict[str, Any] | None:
            rule = prometheus.rule("AgentTaskFailureRatioHigh")
            return rule if rule["state"] == "pending" else None

        # Its value is the last evaluation's: one made before the 40th task was scraped
        # reads 5/39 (the alert can go pending on that one); each evaluation renews it.
        def pending_at_six_of_forty() -> dict[str, Any] | None:
            rule = pending()
            value = float(rule["alerts"][0]["value"]) if rule else None
            return rule if value == pytest.approx(6 / 40) else None

        wait_until(pending_at_six_of_forty, 30, "AgentTaskFailureRatioHigh pending at 6/40")
