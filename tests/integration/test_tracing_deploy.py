"""The tracing wiring of deploy/: the compose override, the Kubernetes overlay (read, and
built as ``kubectl apply -k`` builds it), Grafana's link from a task's duration to its
trace, and the image's tracing extra. Checked offline."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.support.kustomize import KUSTOMIZE_MISSING, built_objects, kustomize_command

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OVERLAY = DEPLOY / "kubernetes" / "tracing"
TRACED_PROCESSES = {"worker", "mcp-hub", "mcp-web", "mcp-memory", "scheduler"}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_the_compose_override_points_every_process_at_the_tracing_backend() -> None:
    base = load(DEPLOY / "compose.yaml")["services"]
    override = load(DEPLOY / "compose.tracing.yaml")["services"]

    traced = {name for name, service in override.items() if "environment" in service}
    assert traced == TRACED_PROCESSES
    assert traced <= set(base)
    for name in traced:
        environment = override[name]["environment"]
        assert all(variable.startswith("OTEL_") for variable in environment), name
        endpoint = urlsplit(environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert (endpoint.hostname, endpoint.port) == ("jaeger", 4318), name
        sampler = re.fullmatch(
            r"\$\{OTEL_TRACES_SAMPLER:-(\w+)\}", environment["OTEL_TRACES_SAMPLER"]
        )
        assert sampler is not None
        assert entry_points(group="opentelemetry_traces_sampler", name=sampler.group(1))
    assert "jaeger" not in base  # tracing stays opt-in


def overlay_documents() -> list[dict[str, Any]]:
    kustomization = load(OVERLAY / "kustomization.yaml")
    documents = []
    for resource in kustomization["resources"]:
        if resource != "../base":
            documents.extend(d for d in yaml.safe_load_all((OVERLAY / resource).read_text()) if d)
    return documents


@pytest.mark.parametrize(
    "document", overlay_documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_the_collector_objects_are_valid_for_kubernetes(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_the_overlay_patches_every_process_to_send_to_the_collector() -> None:
    kustomization = load(OVERLAY / "kustomization.yaml")
    base = load(DEPLOY / "kubernetes" / "base" / "kustomization.yaml")
    deployments = {
        document["metadata"]["name"]: document
        for resource in base["resources"]
        for document in yaml.safe_load_all((DEPLOY / "kubernetes" / "base" / resource).read_text())
        if document and document["kind"] == "Deployment"
    }
    (patch,) = kustomization["patches"]
    targets = set(patch["target"]["name"].split("|"))
    assert targets == TRACED_PROCESSES <= set(deployments)
    for name in targets:  # the JSON patch appends to containers[0].env: it must exist
        assert isinstance(
            deployments[name]["spec"]["template"]["spec"]["containers"][0]["env"], list
        )
    (generated,) = kustomization["configMapGenerator"]
    literals = dict(literal.split("=", 1) for literal in generated["literals"])
    added = {operation["value"]["name"] for operation in yaml.safe_load(patch["patch"])}
    assert added == set(literals)
    endpoint = urlsplit(literals["OTEL_EXPORTER_OTLP_ENDPOINT"])
    (service,) = [d for d in overlay_documents() if d["kind"] == "Service"]
    assert endpoint.hostname == service["metadata"]["name"]
    assert endpoint.port in {port["port"] for port in service["spec"]["ports"]}


def test_the_built_overlay_is_the_fleet_with_every_process_sending_to_the_collector() -> None:
    if kustomize_command() is None:
        pytest.skip(KUSTOMIZE_MISSING)
    built = built_objects(OVERLAY)
    fleet = built_objects(DEPLOY / "kubernetes")
    assert {(d["kind"], d["metadata"]["name"]) for d in fleet} < {
        (d["kind"], d["metadata"]["name"]) for d in built
    }
    config_maps = {d["metadata"]["name"]: d for d in built if d["kind"] == "ConfigMap"}
    endpoint = config_maps["tracing-env"]["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    for deployment in (d for d in built if d["kind"] == "Deployment"):
        (container, *_) = deployment["spec"]["template"]["spec"]["containers"]
        env = {variable["name"]: variable for variable in container.get("env", [])}
        name = deployment["metadata"]["name"]
        if name in TRACED_PROCESSES:
            reference = env["OTEL_EXPORTER_OTLP_ENDPOINT"]["valueFrom"]["configMapKeyRef"]
            assert reference["name"] == "tracing-env", name
    assert urlsplit(endpoint).hostname == "otel-collector"


def test_grafana_links_a_tasks_duration_to_its_trace() -> None:
    (datasource,) = load(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")["datasources"]
    (destination,) = datasource["jsonData"]["exemplarTraceIdDestinations"]
    # The exemplar label the worker writes on agent_task_duration_seconds.
    assert destination["name"] == "trace_id"
    assert "${__value.raw}" in destination["url"]
    dashboard = (DEPLOY / "grafana/dashboards/agent-worker.json").read_text()
    assert '"exemplar": true' in dashboard
    prometheus = load(DEPLOY / "compose.yaml")["services"]["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in prometheus


def test_the_image_installs_the_tracing_extra() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "ARG TRACING_EXTRA=tracing" in dockerfile
    assert 'pip install ".[$TRACING_EXTRA]"' in dockerfile
