"""The operator's deploy/ folder, checked with the real tools and the real worker code.

Prometheus rules and config go through promtool (checks and rule unit tests),
the Grafana dashboard's queries through promtool and against the metrics the
worker really exports, the compose file against the repository and the worker's
settings, deploy/mcp.yaml against our running MCP servers, the image's health
check against the worker's /healthz, and the systemd units through
systemd-analyze when it is available.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import urlopen

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from mcp_servers import hub as hub_server
from mcp_servers import memory as memory_server
from mcp_servers import web as web_server
from mcp_servers._ssrf import AddressPolicy
from tests.support.definitions import SHIPPED_DEMO_AGENTS
from tests.support.mcp_servers import running_mcp
from tests.support.promtool import (
    DASHBOARD,
    PROMETHEUS_DIR,
    PROMTOOL_MISSING,
    find_promtool,
    substituted,
)
from tests.support.redis_server import RedisServer, free_port, running_redis
from tests.support.strict_yaml import load_document
from tests.support.workers import running_worker
from worker.agents._config import Limits
from worker.metrics import JobMetrics, start_metrics_server, stop_metrics_server
from worker.metrics._families import COUNTERS, KNOWN_LABEL_SETS
from worker.metrics._recorders import WorkerMetrics
from worker.settings import Settings
from worker.tools._config import load_mcp_config
from worker.tools._grants import load_grant_policy
from worker.tools._mcp import McpToolbox

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# The definitions compose mounts by default (AGENTS_HOST_DIR unset).
SYSTEMD_DIR = DEPLOY / "systemd"

# docs/reference/metrics.md: metric -> labels. Histograms also expose _bucket (le), _sum, _count.
SECTION_10_METRICS: dict[str, frozenset[str]] = {
    "agent_tasks_total": frozenset({"agent", "type", "outcome"}),
    "agent_task_duration_seconds": frozenset({"type"}),
    "agent_loop_iterations": frozenset({"type"}),
    "agent_llm_calls_total": frozenset({"provider", "model", "status"}),
    "agent_llm_tokens_total": frozenset({"model", "direction"}),
    "agent_cost_usd_total": frozenset({"agent"}),
    "agent_tool_calls_total": frozenset({"server", "tool", "outcome"}),
    "agent_tool_call_duration_seconds": frozenset({"server"}),
    "agent_grant_denials_total": frozenset({"agent", "tool"}),
    "agent_errors_posted_total": frozenset(),
    "agent_outbox_items": frozenset(),
    "agent_queue_jobs": frozenset({"queue", "state"}),
}
HISTOGRAMS = frozenset(
    {"agent_task_duration_seconds", "agent_loop_iterations", "agent_tool_call_duration_seconds"}
)
# Exported by the worker beyond the original list: failures before our code runs (trap 15).
WORKER_EXTRA_METRICS: dict[str, frozenset[str]] = {
    "agent_outbox_dead_letters_total": frozenset({"kind"}),
    "agent_hub_writes_refused_total": frozenset({"agent", "kind", "reason"}),
    "agent_scope_refusals_total": frozenset({"agent", "tool"}),
    "agent_egress_refusals_total": frozenset({"agent", "tool"}),
    "agent_jobs_undecodable_total": frozenset(),
    "agent_redis_unavailable_total": frozenset({"kind"}),
}
# Series Prometheus itself writes for every target.
PROMETHEUS_METRICS: dict[str, frozenset[str]] = {"up": frozenset()}
TARGET_LABELS = frozenset({"job", "instance"})
# Redis-backed gauges: every worker exports the same value, so never sum them.
SAME_ON_EVERY_WORKER = ("agent_queue_jobs", "agent_outbox_items")
FAILING_OUTCOMES = {"model_error", "autonomy_violation", "invalid_task", "error"}

OUR_SERVICES = ("worker", "mcp-hub", "mcp-web", "mcp-memory", "scheduler")
PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
# Beyond our Settings, the worker container sets what rq's CLI reads.
RQ_VARIABLES = frozenset({"RQ_WORKER_CLASS", "RQ_CONFIG"})


def longest_default_task_s() -> float:
    """What a stop must wait for: the default task deadline plus the job grace."""
    max_duration_s = Limits.model_fields["max_duration_s"].default
    grace_s = Settings.model_fields["job_timeout_grace_s"].default
    return float(max_duration_s) + float(grace_s)


# --- promtool -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    found = find_promtool()
    if found is None:
        pytest.skip(PROMTOOL_MISSING)
    return found


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- PromQL, read just enough to name metrics and labels -----------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_GRAFANA_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
)


# Grafana's variables, replaced by what they stand for so promtool can parse the query.
def metric_names(expression: str) -> set[str]:
    """Metric names a PromQL expression selects, histogram suffixes removed."""
    text = _STRING.sub('""', expression)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GRAFANA_VARIABLE.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        if name.lower() in _PROMQL_KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(_without_histogram_suffix(name))
    return names


def _without_histogram_suffix(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in HISTOGRAMS:
            return name.removesuffix(suffix)
    return name


def label_names(expression: str) -> set[str]:
    """Label names an expression matches on or groups by."""
    text = _STRING.sub('""', expression)
    labels: set[str] = set()
    for body in _MATCHERS.findall(text):
        labels.update(_MATCHER_LABEL.findall(body))
    for body in _GROUPING.findall(text):
        labels.update(label.strip() for label in body.split(",") if label.strip())
    return labels


def assert_uses_known_metrics(
    where: str, expression: str, known: dict[str, frozenset[str]]
) -> None:
    names = metric_names(expression)
    assert names, f"{where}: no metric found in {expression!r}"
    unknown = names - known.keys()
    assert not unknown, f"{where}: {sorted(unknown)} are not worker metrics: {expression!r}"
    allowed_labels = {"le"} | TARGET_LABELS
    for name in names:
        allowed_labels |= known[name]
    stray = label_names(expression) - allowed_labels
    assert not stray, f"{where}: labels {sorted(stray)} do not exist on {sorted(names)}"


# --- the files ----------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return load_document(path)


@cache
def alert_rules() -> list[dict[str, Any]]:
    document = load_yaml(PROMETHEUS_DIR / "alerts.yml")
    return [rule for group in document["groups"] for rule in group["rules"]]


@cache
def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return document


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included, rows themselves excluded."""
    found = []
    for panel in dashboard()["panels"]:
        found.extend(panel.get("panels", []))
        if panel["type"] != "row":
            found.append(panel)
    return found


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


def all_expressions() -> list[tuple[str, str]]:
    alerts = [(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    return alerts + [(f"panel {title!r}", expr) for title, expr in dashboard_expressions()]


@cache
def compose() -> dict[str, Any]:
    document: dict[str, Any] = load_yaml(DEPLOY / "compose.yaml")
    return document


def service(name: str) -> dict[str, Any]:
    definition: dict[str, Any] = compose()["services"][name]
    return definition


def environment(service_name: str) -> dict[str, str | None]:
    """A service's environment; None is a variable passed through from deploy/.env."""
    raw = service(service_name).get("environment") or {}
    if isinstance(raw, list):
        pairs = (entry.partition("=") for entry in raw)
        return {name: value if sep else None for name, sep, value in pairs}
    return {name: None if value is None else str(value) for name, value in raw.items()}


_COMPOSE_REFERENCE = re.compile(r"\$\{([A-Za-z_]\w*)(?:(:?[-?])([^}]*))?\}")


def with_defaults(text: str) -> str:
    """``${VAR:-default}`` replaced by its default, as compose does without deploy/.env."""

    def default(match: re.Match[str]) -> str:
        assert match.group(2) in (":-", "-"), f"{match.group()} has no default"
        return match.group(3)

    return _COMPOSE_REFERENCE.sub(default, text)


def bind_mounts(service_name: str) -> list[tuple[Path, str]]:
    """(host path, container path) of a service's bind mounts; named volumes left out."""
    mounts = []
    for volume in service(service_name).get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") != "bind":
                continue
            source, target = str(volume["source"]), str(volume["target"])
        else:
            source, target = with_defaults(volume).split(":")[:2]
            if not source.startswith((".", "/")):
                continue
        mounts.append(((DEPLOY / with_defaults(source)).resolve(), target))
    return mounts


def mount_target(service_name: str, host_path: Path) -> str:
    targets = [target for source, target in bind_mounts(service_name) if source == host_path]
    assert targets, f"{service_name} does not mount {host_path.relative_to(REPO)}"
    return targets[0]


def parse_duration_s(text: str) -> float:
    """Compose (``420s``, ``7m``, ``1m30s``) and systemd (``420``, ``7min``) durations."""
    text = str(text).strip()
    if text.isdigit():
        return float(text)
    units = {"h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|min|ms|m|s)", text)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == text.replace(" ", ""), text
    return sum(float(number) * units[unit] for number, unit in parts)


def systemd_unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (keys like Environment= may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw_line in (SYSTEMD_DIR / name).read_text(encoding="utf-8").splitlines():
        line = pending + raw_line.strip()
        pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{name}: {line!r} before any section"
        key, separator, value = line.partition("=")
        assert separator, f"{name}: {line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= expected once, found {values}"
    return values[0]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined."""
    instructions = []
    pending = ""
    for raw_line in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = raw_line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = pending + stripped
        pending = ""
        keyword, _, arguments = line.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


# --- the worker's real exposition -----------------------------------------------------------


@pytest.fixture
def exported_metrics(redis_url: str) -> dict[str, frozenset[str]]:
    """Metric name -> label names, read from the exposition of the worker's own registry.

    One of every job-side event is recorded and applied, and the Redis-backed
    gauges read a real Redis, so every metric has samples that carry its labels.
    """
    metrics = WorkerMetrics()
    metrics.watch_queues(lambda: Redis.from_url(redis_url), ["agents"])
    recorded = JobMetrics()
    recorded.task_finished(
        agent="devops-agent",
        task_type="notification",
        outcome="completed",
        duration_s=3.0,
        iterations=2,
        cost_usd=0.01,
    )
    recorded.llm_call(
        provider="anthropic", model="m", status="ok", tokens_input=10, tokens_output=5
    )
    recorded.tool_call(server="hub", tool="search_posts", outcome="ok", duration_s=0.2)
    recorded.grant_denied(agent="devops-agent", tool="hub__create_post")
    recorded.error_posted()
    recorded.dead_letter("consumption")
    recorded.write_refused(agent="devops-agent", kind="comment", reason="daily_limit")
    recorded.scope_refused(agent="devops-agent", tool="hub__create_post")
    recorded.egress_refused(agent="devops-agent", tool="web__fetch")
    recorded.apply_locally(metrics)
    metrics.job_undecodable()
    metrics.redis_unavailable("oom")

    exposition = generate_latest(metrics.registry).decode()
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = _without_histogram_suffix(sample.name)
            exported.setdefault(name, set()).update(set(sample.labels) - {"le"})
    return {name: frozenset(labels) for name, labels in exported.items()}


# === Prometheus ============================================================================


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    result = run_promtool(promtool, "check", "rules", PROMETHEUS_DIR / "alerts.yml")

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_prometheus_config_passes_promtool_check_and_loads_the_alerts(promtool: str) -> None:
    result = run_promtool(promtool, "check", "config", PROMETHEUS_DIR / "prometheus.yml")

    assert result.returncode == 0, result.stdout + result.stderr
    # The rule file was found relative to the config and checked with it.
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_alert_unit_tests_pass_and_every_alert_is_shown_firing(promtool: str) -> None:
    result = run_promtool(promtool, "test", "rules", PROMETHEUS_DIR / "alerts_test.yml")

    assert result.returncode == 0, result.stdout + result.stderr
    tests = load_yaml(PROMETHEUS_DIR / "alerts_test.yml")["tests"]
    shown_firing = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    shown_quiet = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if not case.get("exp_alerts")
    }
    every_alert = {rule["alert"] for rule in alert_rules()}
    assert shown_firing == every_alert
    assert {"AgentWorkerDown", "AgentTaskFailureRatioHigh"} <= shown_quiet


def test_every_alert_waits_has_a_severity_and_says_what_to_do() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        assert parse_duration_s(rule["for"]) >= 60, f"{name}: for must be at least 1m"
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["summary"].strip(), name
        assert len(rule["annotations"]["description"].split()) >= 10, name


def test_failure_ratio_alert_counts_exactly_the_failing_outcomes() -> None:
    (rule,) = (rule for rule in alert_rules() if rule["alert"] == "AgentTaskFailureRatioHigh")

    patterns = set(re.findall(r'outcome=~"([^"]+)"', rule["expr"]))

    assert [set(pattern.split("|")) for pattern in patterns] == [FAILING_OUTCOMES]


def test_scrape_job_finds_the_compose_workers_on_the_metrics_port() -> None:
    config = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    (discovery,) = jobs["agent-worker"]["dns_sd_configs"]
    assert discovery["type"] == "A"
    assert discovery["port"] == Settings.model_fields["metrics_port"].default
    assert discovery["port"] == int(environment("worker")["METRICS_PORT"] or 0)
    assert discovery["names"] == ["worker"]
    assert "worker" in compose()["services"]
    # Alerts select the job by the name the scrape config gives it.
    for rule in alert_rules():
        for job in re.findall(r'job="([^"]+)"', rule["expr"]):
            assert job in jobs, f"{rule['alert']} selects unknown job {job!r}"


def test_redis_backed_gauges_are_never_summed() -> None:
    for where, expression in all_expressions():
        if any(name in expression for name in SAME_ON_EVERY_WORKER):
            assert not re.search(r"\bsum\b", expression), f"{where} sums {expression!r}"
            assert re.search(r"\bmax\b", expression), f"{where} should take max: {expression!r}"


# === Grafana ===============================================================================


def test_dashboard_is_provisioned_with_the_prometheus_datasource() -> None:
    datasources = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")
    (datasource,) = datasources["datasources"]
    providers = load_yaml(DEPLOY / "grafana/provisioning/dashboards/agent-worker.yaml")
    (provider,) = providers["providers"]
    board = dashboard()

    assert board["uid"] and board["title"]
    assert board["schemaVersion"] >= 36
    assert datasource["type"] == "prometheus"
    url = urlsplit(datasource["url"])
    assert url.hostname == "prometheus" and url.port == 9090
    assert "prometheus" in compose()["services"]
    # The provider reads the directory compose mounts the dashboards into.
    assert provider["options"]["path"] == mount_target("grafana", DASHBOARD.parent)
    assert mount_target("grafana", DEPLOY / "grafana/provisioning") == "/etc/grafana/provisioning"
    panels = dashboard_panels()
    rows = [panel for panel in board["panels"] if panel["type"] == "row"]
    ids = [panel["id"] for panel in rows + panels]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == datasource["uid"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    for variable in board["templating"]["list"]:
        assert variable["datasource"]["uid"] == datasource["uid"]


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{index}", "expr": substituted(expression)}
        for index, (_, expression) in enumerate(dashboard_expressions())
    ]
    rule_file = tmp_path / "dashboard-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))

    result = run_promtool(promtool, "check", "rules", rule_file)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_dashboard_and_alerts_use_only_metrics_and_labels_of_the_contract() -> None:
    known = {**SECTION_10_METRICS, **WORKER_EXTRA_METRICS, **PROMETHEUS_METRICS}
    for where, expression in all_expressions():
        assert_uses_known_metrics(where, expression, known)
    for variable in dashboard()["templating"]["list"]:
        metric, label = re.fullmatch(
            r"label_values\((\w+),\s*(\w+)\)", variable["definition"]
        ).groups()  # type: ignore[union-attr]
        assert label in known[metric], variable["name"]


def test_dashboard_shows_every_section_10_metric() -> None:
    shown = set().union(*(metric_names(expression) for _, expression in dashboard_expressions()))

    assert set(SECTION_10_METRICS) <= shown


def test_dashboard_has_the_operator_panels() -> None:
    queries: dict[str, list[str]] = {title: [] for title, _ in dashboard_expressions()}
    for title, expression in dashboard_expressions():
        queries[title].append(re.sub(r"\s+", " ", expression))

    duration = " ".join(queries["Task duration"])
    for quantile in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({quantile}," in duration
    assert "agent_task_duration_seconds_bucket" in duration
    assert queries["Queue depth by state"] == ["max by (queue, state) (agent_queue_jobs)"]
    assert "by (outcome)" in queries["Tasks by outcome"][0]
    assert "by (model, direction)" in queries["Tokens by model and direction"][0]
    assert "by (agent)" in queries["Cost by agent"][0]
    read, written = queries["Prompt cache hit ratio"]
    assert 'direction="cache_read"' in read and 'direction="cache_write"' in written
    assert all('{direction="input"}' in query for query in (read, written))
    assert "by (agent, tool)" in queries["Grant denials by agent and tool"][0]


def test_worker_exports_the_section_10_metrics(
    exported_metrics: dict[str, frozenset[str]],
) -> None:
    for name, labels in SECTION_10_METRICS.items():
        assert exported_metrics.get(name) == labels, name
    for name, labels in WORKER_EXTRA_METRICS.items():
        assert exported_metrics.get(name) == labels, name


def test_dashboard_and_alerts_match_what_the_worker_exports(
    exported_metrics: dict[str, frozenset[str]],
) -> None:
    known = {**exported_metrics, **PROMETHEUS_METRICS}
    for where, expression in all_expressions():
        assert_uses_known_metrics(where, expression, known)


# Queried series a first scrape cannot show: each label set carries an agent, model, tool or
# server the worker learns of only when a task names it (initialising every agent, type and
# outcome would multiply the exposition for events most agents never have).
OPEN_LABEL_SETS = {
    "agent_tasks_total", "agent_task_duration_seconds", "agent_loop_iterations",
    "agent_grant_denials_total", "agent_scope_refusals_total", "agent_egress_refusals_total",
    "agent_cost_usd_total",
    "agent_tool_calls_total",
    "agent_tool_call_duration_seconds", "agent_llm_calls_total", "agent_llm_tokens_total",
}  # fmt: skip


def test_a_first_scrape_shows_every_queried_series_whose_labels_are_known_at_0(
    redis_url: str,
) -> None:
    with running_worker(redis_url, metrics_port=free_port()) as worker:
        port = worker.wait_for_event("worker_started")["metrics_port"]
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            exposition = response.read().decode()

    sampled: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            name = _without_histogram_suffix(sample.name)
            sampled.setdefault(name, {})[frozenset(sample.labels.items())] = sample.value
    queried = {name for _, expression in all_expressions() for name in metric_names(expression)}
    queried -= set(PROMETHEUS_METRICS)
    assert {name for name in queried if name not in sampled} == OPEN_LABEL_SETS & queried
    # The alerts' closed label sets, each at 0 before anything happened.
    for name, label_sets in KNOWN_LABEL_SETS.items():
        assert name in queried
        label = COUNTERS[name][1][0]
        assert {dict(key)[label]: value for key, value in sampled[name].items()} == {
            labels[0]: 0.0 for labels in label_sets
        }
    assert sampled["agent_jobs_undecodable_total"] == {frozenset(): 0.0}
    assert {"oom", "connection"} <= {
        kinds[0] for kinds in KNOWN_LABEL_SETS["agent_redis_unavailable_total"]
    }


# === Docker image ===========================================================================


def test_image_is_slim_non_root_and_runs_the_worker_by_default() -> None:
    instructions = dockerfile_instructions()
    runtime = final_stage(instructions)
    commands = [arguments for keyword, arguments in instructions if keyword == "RUN"]

    assert all(
        arguments.split()[0] == "python:3.11-slim"
        for keyword, arguments in instructions
        if keyword == "FROM"
    )
    users = [arguments for keyword, arguments in runtime if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any(re.search(r"\bpip install \.(\s|$)", command) for command in commands)
    assert not any("[test]" in command for command in commands)
    environment = " ".join(arguments for keyword, arguments in runtime if keyword == "ENV").split()
    # `rq worker agents` as the Procfile runs it: our worker class and our rq settings module
    # (RQ_CONFIG: REDIS_URL read through our settings, one line for a mistake in it).
    procfile_worker = (REPO / "Procfile").read_text().splitlines()[0].removeprefix("worker: ")
    assignments = [word for word in procfile_worker.split() if "=" in word]
    assert assignments == ["RQ_WORKER_CLASS=worker.AgentWorker", "RQ_CONFIG=worker.rq_config"]
    assert set(assignments) <= set(environment)
    (command,) = [arguments for keyword, arguments in runtime if keyword == "CMD"]
    assert json.loads(command) == ["agent-worker", "pool"]
    assert ("STOPSIGNAL", "SIGTERM") in runtime


def test_image_copies_only_files_that_exist() -> None:
    for keyword, arguments in dockerfile_instructions():
        if keyword != "COPY" or arguments.startswith("--from"):
            continue
        *sources, _destination = arguments.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"


def healthcheck_command() -> str:
    (arguments,) = [a for keyword, a in dockerfile_instructions() if keyword == "HEALTHCHECK"]
    options, separator, command = arguments.partition(" CMD ")
    assert separator, "HEALTHCHECK needs a CMD"
    assert "--interval" in options
    return command


def run_healthcheck(metrics_port: int) -> int:
    """The image's HEALTHCHECK command, run by a shell as Docker runs it."""
    python_dir = str(Path(sys.executable).parent)
    result = subprocess.run(
        ["/bin/sh", "-c", healthcheck_command()],
        env={
            "PATH": f"{python_dir}:{os.environ.get('PATH', '')}",
            "METRICS_PORT": str(metrics_port),
        },
        capture_output=True,
        timeout=30,
        check=False,
    )
    return result.returncode


@pytest.fixture
def worker_health_endpoint() -> Iterator[tuple[int, Any]]:
    """The worker's real /metrics and /healthz server on a free port, with its own Redis."""
    with running_redis() as redis_server:
        port = start_metrics_server(
            free_port(),
            lambda: Redis(port=redis_server.port, socket_timeout=2, socket_connect_timeout=2),
            metrics=WorkerMetrics(),
        )
        assert port is not None
        try:
            yield port, redis_server
        finally:
            stop_metrics_server()


def test_image_healthcheck_follows_the_worker_healthz(
    worker_health_endpoint: tuple[int, Any],
) -> None:
    port, redis_server = worker_health_endpoint

    assert run_healthcheck(port) == 0

    redis_server.stop()
    assert run_healthcheck(port) != 0


def test_image_healthcheck_fails_when_nothing_listens() -> None:
    assert run_healthcheck(free_port()) != 0


# === Compose ===============================================================================


def test_compose_runs_the_whole_fleet() -> None:
    services = compose()["services"]

    assert set(services) >= {
        "redis",
        "worker",
        "mcp-hub",
        "mcp-web",
        "mcp-memory",
        "scheduler",
        "prometheus",
        "grafana",
    }
    assert services["worker"]["command"] == ["agent-worker", "pool"]
    assert services["scheduler"]["command"] == ["agent-worker", "schedule"]
    assert services["mcp-hub"]["command"][:3] == ["python", "-m", "mcp_servers.hub"]
    assert services["mcp-web"]["command"][:3] == ["python", "-m", "mcp_servers.web"]
    assert services["mcp-memory"]["command"][:3] == ["python", "-m", "mcp_servers.memory"]
    assert environment("worker")["RQ_WORKER_CLASS"] == "worker.AgentWorker"
    # rq's CLI falls back to REDIS_URL: a second variable could only make them differ.
    assert "REDIS_URL" in environment("worker")
    assert "RQ_REDIS_URL" not in environment("worker")


def test_our_services_run_one_image_built_from_deploy_dockerfile() -> None:
    images = set()
    for name in OUR_SERVICES:
        build = service(name)["build"]
        assert (DEPLOY / build["context"]).resolve() == REPO, name
        assert (REPO / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile", name
        images.add(service(name)["image"])
    assert len(images) == 1


def test_every_file_compose_mounts_exists() -> None:
    named_volumes = set(compose().get("volumes") or {})
    for name, definition in compose()["services"].items():
        for source, _target in bind_mounts(name):
            assert source.exists(), f"{name} mounts {source}, which does not exist"
            assert REPO in source.parents, f"{name} mounts {source} from outside the repository"
        for volume in definition.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/", "$")):
                assert volume.split(":")[0] in named_volumes, f"{name}: {volume}"


def test_worker_config_files_are_the_mounted_deploy_files() -> None:
    worker_environment = environment("worker")

    for variable, file_name in (
        ("MCP_CONFIG", "mcp.yaml"),
        ("GRANT_POLICY", "grant-policy.yaml"),
        ("PRICES_FILE", "prices.yaml"),
    ):
        assert worker_environment[variable] == mount_target("worker", DEPLOY / file_name)
    agents_dir = with_defaults(worker_environment["AGENTS_DIR"] or "")
    agents_mount = [target for _, target in bind_mounts("worker") if target == agents_dir]
    assert agents_mount, f"AGENTS_DIR {agents_dir} is not mounted"


def test_secrets_reach_only_the_services_that_need_them() -> None:
    def holders(variable: str) -> set[str]:
        return {name for name in compose()["services"] if variable in environment(name)}

    assert holders("HUB_API_KEY") == {"worker", "mcp-hub", "scheduler"}
    for key in PROVIDER_KEYS:
        assert holders(key) == {"worker"}, key
    assert holders("MCP_AUTH_TOKEN") == {"worker", "mcp-hub", "mcp-web", "mcp-memory"}
    # The embeddings key reaches only the processes that embed (the worker, mcp-memory).
    assert holders("MEMORY_EMBEDDINGS_API_KEY") == {"worker", "mcp-memory"}
    # An env_file would hand the whole deploy/.env to a service.
    for name, definition in compose()["services"].items():
        assert "env_file" not in definition, name


def test_compose_file_holds_no_secret_value() -> None:
    secret_name = re.compile(r"KEY|TOKEN|PASSWORD|SECRET")
    for name in compose()["services"]:
        for variable, value in environment(name).items():
            if not secret_name.search(variable):
                continue
            # Passed through, or a reference to a variable of deploy/.env.
            assert value is None or re.fullmatch(r"\$\{[A-Z_]+(:?[-?][^}]*)?\}", value), (
                f"{name}: {variable} has a literal value"
            )


def documented_variables() -> dict[str, str]:
    """Variable -> example value of deploy/.env.example (commented-out lines included)."""
    documented = {}
    for line in (DEPLOY / ".env.example").read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"#?\s*([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            documented[match.group(1)] = match.group(2)
    return documented


def test_env_example_documents_every_variable_compose_reads() -> None:
    compose_text = (DEPLOY / "compose.yaml").read_text(encoding="utf-8")
    referenced = {match.group(1) for match in _COMPOSE_REFERENCE.finditer(compose_text)}
    passed_through = {
        variable
        for name in compose()["services"]
        for variable, value in environment(name).items()
        if value is None
    }
    documented = documented_variables()

    missing = (referenced | passed_through) - documented.keys()
    assert not missing, f"not in deploy/.env.example: {sorted(missing)}"
    for variable, example in documented.items():
        if re.search(r"(?<![A-Z])(KEY|TOKEN|PASSWORD|SECRET)(?![A-Z])", variable):
            assert example == "", f"{variable} must not have an example value"


def test_worker_container_receives_every_setting() -> None:
    worker_environment = set(environment("worker"))
    settings_variables = {name.upper() for name in Settings.model_fields}

    assert settings_variables <= worker_environment, sorted(settings_variables - worker_environment)
    assert worker_environment - settings_variables <= RQ_VARIABLES


def test_worker_stop_waits_for_the_running_task() -> None:
    grace_s = parse_duration_s(service("worker")["stop_grace_period"])

    assert grace_s >= longest_default_task_s()


def test_mcp_config_points_at_the_compose_mcp_services() -> None:
    config = load_mcp_config(DEPLOY / "mcp.yaml")

    servers = (("hub", "mcp-hub"), ("web", "mcp-web"), ("memory", "mcp-memory"))
    for server_name, service_name in servers:
        url = urlsplit(config.servers[server_name].url or "")
        assert (url.scheme, url.hostname, url.path) == ("http", service_name, "/mcp")
        command = service(service_name)["command"]
        assert command[command.index("--host") + 1] == "0.0.0.0"
        assert int(command[command.index("--port") + 1]) == url.port


@pytest.mark.anyio
async def test_mcp_config_maps_every_tool_our_servers_expose_and_nothing_else() -> None:
    config = load_mcp_config(DEPLOY / "mcp.yaml")
    hub_tools = await hub_server.build_server(hub_url="http://127.0.0.1:9").list_tools()
    web_tools = await web_server.build_server(policy=AddressPolicy()).list_tools()

    assert set(config.servers["hub"].tools) == {tool.name for tool in hub_tools}
    assert set(config.servers["web"].tools) == {tool.name for tool in web_tools}
    assert config.servers["web"].tools == {"fetch": "web:read"}
    memory_tools = await memory_server.build_server(Settings()).list_tools()
    assert set(config.servers["memory"].tools) == {tool.name for tool in memory_tools}
    assert config.servers["memory"].tools == memory_server.TOOL_GRANTS


@pytest.mark.anyio
async def test_deploy_mcp_config_and_grant_policy_drive_the_real_servers(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    token = "deploy-test-token-8d2e"
    policy = load_grant_policy(DEPLOY / "grant-policy.yaml")
    with (
        running_mcp("hub", hub_url=f"http://127.0.0.1:{free_port()}", auth_token=token) as hub,
        running_mcp("web", auth_token=token) as web,
        running_mcp(
            "memory",
            redis_url=redis_server.url,
            agents_dir=str(SHIPPED_DEMO_AGENTS),
            auth_token=token,
        ) as memory,
    ):
        # deploy/mcp.yaml as it is, with the compose hostnames pointed at these servers.
        document = load_yaml(DEPLOY / "mcp.yaml")
        document["servers"]["hub"]["url"] = hub.url
        document["servers"]["web"]["url"] = web.url
        document["servers"]["memory"]["url"] = memory.url
        local_config = tmp_path / "mcp.yaml"
        local_config.write_text(yaml.safe_dump(document))
        config = load_mcp_config(local_config)

        async def offered(agent: str) -> set[str]:
            grants = policy.effective_grants(agent, ["hub:*", "web:*", "memory:*"])
            async with McpToolbox.open(config, grants=grants, auth_token=token) as toolbox:
                assert not toolbox.unavailable_servers
                return {spec.name for spec in toolbox.offered()}

        everything = {
            f"{server}__{tool}"
            for server in ("hub", "web", "memory")
            for tool in document["servers"][server]["tools"]
        }
        assert await offered("any-agent") == everything
        # The read-only example agent of the policy loses the Hub's write tools and memory.
        assert await offered("research-agent") == {
            name
            for name in everything
            if name not in {"hub__create_post", "hub__create_comment"}
            and not name.startswith("memory__")
        }


def test_grant_policy_example_never_grants_hub_administration() -> None:
    policy = load_grant_policy(DEPLOY / "grant-policy.yaml")

    for agent in ("any-agent", "research-agent", "demo-agent"):
        grants = policy.effective_grants(agent, ["hub:*"])
        assert grants.covers("hub:read"), agent
        assert not grants.covers("hub:admin"), agent


# === systemd ===============================================================================


def test_worker_unit_shuts_down_warm_and_waits_for_the_task() -> None:
    unit = systemd_unit("agent-worker.service")

    assert one(unit, "Service", "KillMode") == "mixed"
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert parse_duration_s(one(unit, "Service", "TimeoutStopSec")) >= longest_default_task_s()
    assert parse_duration_s(one(unit, "Service", "TimeoutStopSec")) >= 360
    assert shlex.split(one(unit, "Service", "ExecStart"))[1:] == ["pool"]
    assert Path(shlex.split(one(unit, "Service", "ExecStart"))[0]).name == "agent-worker"
    assert "RQ_WORKER_CLASS=worker.AgentWorker" in unit["Service"]["Environment"]
    assert one(unit, "Service", "EnvironmentFile") == "/etc/agent-worker/env"
    assert one(unit, "Service", "Restart") == "always"
    assert one(unit, "Service", "User") not in ("root", "0")
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    assert one(unit, "Service", "ProtectSystem") == "strict"
    assert one(unit, "Service", "StateDirectory")
    assert one(unit, "Service", "PrivateTmp") == "yes"


def test_mcp_and_scheduler_units_keep_their_secrets_apart() -> None:
    worker_file = one(systemd_unit("agent-worker.service"), "Service", "EnvironmentFile")
    for unit_name, module, port in (
        ("agent-worker-mcp-hub.service", "mcp_servers.hub", "8101"),
        ("agent-worker-mcp-web.service", "mcp_servers.web", "8102"),
        ("agent-worker-mcp-memory.service", "mcp_servers.memory", "8103"),
    ):
        unit = systemd_unit(unit_name)
        command = shlex.split(one(unit, "Service", "ExecStart"))
        assert command[1:3] == ["-m", module], unit_name
        assert command[command.index("--port") + 1] == port, unit_name
        assert one(unit, "Service", "EnvironmentFile") != worker_file, unit_name

    scheduler = systemd_unit("agent-worker-scheduler.service")
    assert shlex.split(one(scheduler, "Service", "ExecStart"))[1:] == ["schedule"]
    unset = one(scheduler, "Service", "UnsetEnvironment").split()
    assert set(PROVIDER_KEYS) <= set(unset)


def test_systemd_env_example_names_one_redis_for_rq_and_the_worker() -> None:
    values = dict(
        line.split("=", 1)
        for line in (SYSTEMD_DIR / "env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )

    assert values["REDIS_URL"].startswith("redis://")
    assert "RQ_REDIS_URL" not in values


def systemd_steps() -> list[str]:
    """The shell lines of docs/how-to/deploy-systemd.md's set-up block, in order."""
    guide = (REPO / "docs" / "how-to" / "deploy-systemd.md").read_text(encoding="utf-8")
    block = re.findall(r"^```sh\n(.*?)^```$", guide, re.S | re.M)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_systemd_steps_install_the_definitions_and_check_before_starting() -> None:
    env_example = (SYSTEMD_DIR / "env.example").read_text()
    (agents_dir,) = re.findall(r"^AGENTS_DIR=(.+)$", env_example, re.M)
    steps = systemd_steps()
    created = [i for i, line in enumerate(steps) if f"install -d -m 755 {agents_dir}" in line]
    copied = [i for i, line in enumerate(steps) if line.startswith("cp -r") and agents_dir in line]
    checked = [i for i, line in enumerate(steps) if "agent-worker check" in line]
    started = [i for i, line in enumerate(steps) if "systemctl enable" in line]
    assert created and copied and checked and started, steps
    assert created[0] < copied[0] < checked[0] < started[0]


def test_worker_down_alert_says_what_it_covers_and_names_the_redis_alert() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    description = rules["AgentWorkerDown"]["annotations"]["description"]
    assert "/healthz" in description and "AgentRedisUnavailable" in description
    assert "agent_redis_unavailable_total" in rules["AgentRedisUnavailable"]["expr"]


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not available: units checked by parsing only")
    # verify wants the executables to exist: point them at this virtualenv's.
    bin_dir = Path(sys.executable).parent
    for unit in SYSTEMD_DIR.glob("*.service"):
        text = unit.read_text(encoding="utf-8").replace("/opt/agent-worker/bin/", f"{bin_dir}/")
        (tmp_path / unit.name).write_text(text, encoding="utf-8")
    units = sorted(tmp_path.glob("*.service"))
    assert {unit.name for unit in units} == {
        "agent-worker.service",
        "agent-worker-mcp-hub.service",
        "agent-worker-mcp-web.service",
        "agent-worker-mcp-memory.service",
        "agent-worker-scheduler.service",
    }

    result = subprocess.run(
        [analyze, "verify", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    # Unknown keys and bad values are only warnings ("..., ignoring"): fail on them too.
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if str(tmp_path) in line or any(unit.name in line for unit in units)
    ]
    assert not complaints, "\n".join(complaints)


def test_image_installs_bubblewrap_for_the_cli_sandbox() -> None:
    runtime = final_stage(dockerfile_instructions())
    commands = " ".join(arguments for keyword, arguments in runtime if keyword == "RUN")
    assert re.search(r"apt-get install -y --no-install-recommends bubblewrap\b", commands)
