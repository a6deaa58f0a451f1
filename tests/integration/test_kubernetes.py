"""deploy/kubernetes, checked offline: builds, schemas, settings, ports, grace period,
processes.

Every kustomization under deploy/ is built as ``kubectl apply -k`` builds it (kustomize,
or kubectl's): a layout kustomize refuses (an overlay inside its base) fails here.

Every core object is validated with ``kubernetes-validate`` (the Kubernetes
OpenAPI schemas it ships, strict: an unknown field fails). The KEDA
ScaledObject is a CRD it does not know, so its fields are checked here. The
rest cross-checks the manifests against the code: each variable is a setting
the process reads, ports are the defaults, the grace period covers the longest
deadline, commands are the Procfile's, the ConfigMaps parse as the worker
parses them, and each process gets only its own secrets.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
from rq import Queue

from mcp_servers._identity import CAPABILITY_KEY_ENV
from mcp_servers._serving import AUTH_TOKEN_ENV
from mcp_servers._ssrf import ALLOW_NETWORKS_ENV
from tests.support.kustomize import KUSTOMIZE_MISSING, built_objects, kustomize_command
from tests.support.strict_yaml import load_document, load_documents
from worker.agents import AgentStore, DefinitionPolicy
from worker.enqueue import DEFAULT_MAX_DURATION_S
from worker.settings import Settings
from worker.tools._config import load_mcp_config
from worker.tools._grants import load_grant_policy

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "deploy" / "kubernetes" / "base"
KUSTOMIZATIONS = sorted(path.parent for path in (REPO_ROOT / "deploy").rglob("kustomization.yaml"))
KUBERNETES_VERSION = kubernetes_validate.latest_version()
# Variables rq's own CLI reads (RQ_CONFIG names worker.rq_config, our settings module for rq).
RQ_VARIABLES = {"RQ_WORKER_CLASS", "RQ_CONFIG"}
SETTINGS_VARIABLES = {name.upper() for name in Settings.model_fields}
# What our MCP servers read from their environment.
MCP_SERVER_VARIABLES = {
    "mcp-hub": {"HUB_URL", "HUB_API_KEY", AUTH_TOKEN_ENV, CAPABILITY_KEY_ENV},
    "mcp-web": {AUTH_TOKEN_ENV, CAPABILITY_KEY_ENV, ALLOW_NETWORKS_ENV},
    # The memory server reads the worker's settings (REDIS_URL, AGENTS_DIR, MEMORY_*).
    "mcp-memory": SETTINGS_VARIABLES | {AUTH_TOKEN_ENV},
}
# Each process's secrets, as deploy/compose.yaml hands them out; provider keys: worker only.
SECRETS_OF = {
    "worker": {"HUB_API_KEY", AUTH_TOKEN_ENV, CAPABILITY_KEY_ENV},
    "mcp-hub": {"HUB_API_KEY", AUTH_TOKEN_ENV, CAPABILITY_KEY_ENV},
    "mcp-web": {AUTH_TOKEN_ENV, CAPABILITY_KEY_ENV},
    "mcp-memory": {AUTH_TOKEN_ENV, CAPABILITY_KEY_ENV},
    "scheduler": {"HUB_API_KEY"},
}
PROVIDER_KEYS = {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}


def load_manifests() -> list[dict[str, Any]]:
    kustomization = load_document(MANIFESTS / "kustomization.yaml")
    documents = []
    for resource in kustomization["resources"]:
        for document in load_documents(MANIFESTS / resource):
            if document is not None:
                documents.append({**document, "_file": resource})
    return documents


DOCUMENTS = load_manifests()


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in DOCUMENTS if d["kind"] == kind}


def containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, deployment in objects("Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield name, container


def env_names(container: dict[str, Any]) -> set[str]:
    """Every variable the container gets: its env list and the ConfigMaps it takes whole."""
    names = {variable["name"] for variable in container.get("env", [])}
    config_maps = objects("ConfigMap")
    for source in container.get("envFrom", []):
        names |= set(config_maps[source["configMapRef"]["name"]]["data"])
    return names


def env_value(container: dict[str, Any], name: str) -> str | None:
    for variable in container.get("env", []):
        if variable["name"] == name:
            value: str | None = variable.get("value")
            return value
    return None


def secret_refs(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        variable["valueFrom"]["secretKeyRef"] | {"variable": variable["name"]}
        for variable in container.get("env", [])
        if "secretKeyRef" in variable.get("valueFrom", {})
    ]


def procfile() -> dict[str, list[str]]:
    lines = (REPO_ROOT / "Procfile").read_text().splitlines()
    return {
        name: shlex.split(command) for name, _, command in (line.partition(": ") for line in lines)
    }


# --- builds --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kustomize() -> None:
    if kustomize_command() is None:
        pytest.skip(KUSTOMIZE_MISSING)


def test_the_shipped_kustomizations_are_the_fleet_its_base_and_the_tracing_overlay() -> None:
    names = [path.relative_to(REPO_ROOT).as_posix() for path in KUSTOMIZATIONS]
    assert names == ["deploy/kubernetes", "deploy/kubernetes/base", "deploy/kubernetes/tracing"]


@pytest.mark.usefixtures("kustomize")
@pytest.mark.parametrize(
    "directory", KUSTOMIZATIONS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix()
)
def test_every_kustomization_builds_into_valid_objects_of_the_namespace(directory: Path) -> None:
    built = built_objects(directory)
    assert {(d["kind"], d["metadata"]["name"]) for d in built} >= {
        ("Deployment", "worker"), ("Namespace", "hub-agent-worker")
    }  # fmt: skip
    for document in built:
        if document["kind"] not in {"Namespace", "ScaledObject"}:
            assert document["metadata"]["namespace"] == "hub-agent-worker", document["kind"]
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.usefixtures("kustomize")
def test_the_fleet_builds_to_exactly_the_objects_of_its_base() -> None:
    assert built_objects(MANIFESTS.parent) == built_objects(MANIFESTS)


@pytest.mark.usefixtures("kustomize")
def test_a_build_refuses_an_overlay_that_lives_inside_its_base(tmp_path: Path) -> None:
    # The layout deploy/kubernetes had: the check above can fail.
    (tmp_path / "kustomization.yaml").write_text("resources: [config.yaml]\n")
    (tmp_path / "config.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text("resources: [..]\n")
    with pytest.raises(AssertionError, match="cycle detected"):
        built_objects(tmp_path / "overlay")


# --- schemas -------------------------------------------------------------------------------


def test_every_file_of_the_directory_is_a_kustomize_resource() -> None:
    kustomization = load_document(MANIFESTS / "kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize(
    "document",
    [d for d in DOCUMENTS if d["kind"] != "ScaledObject"],
    ids=lambda d: f"{d['_file']}:{d['kind']}/{d['metadata']['name']}",
)
def test_core_objects_are_valid_for_kubernetes(document: dict[str, Any]) -> None:
    manifest = {k: v for k, v in document.items() if k != "_file"}
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_validation_rejects_a_misspelt_field() -> None:
    # The schemas are found offline and strict mode bites: the check above can fail.
    worker = copy.deepcopy(objects("Deployment")["worker"])
    worker.pop("_file")
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 420
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSION, strict=True)


# --- the KEDA ScaledObject (a CRD: checked field by field) -----------------------------------

SCALED_OBJECT_SPEC = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
}  # fmt: skip
REDIS_TRIGGER_METADATA = {
    "address", "addressFromEnv", "host", "hostFromEnv", "port", "portFromEnv", "listName",
    "listLength", "activationListLength", "databaseIndex", "enableTLS", "unsafeSsl",
    "usernameFromEnv", "passwordFromEnv",
}  # fmt: skip


def test_the_scaled_object_scales_the_workers_on_rqs_queue_list() -> None:
    (scaled,) = objects("ScaledObject").values()
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC
    target = spec["scaleTargetRef"]
    assert set(target) <= {"apiVersion", "kind", "name", "envSourceContainerName"}
    assert (target.get("kind", "Deployment"), target["name"]) == ("Deployment", "worker")
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[field], int) and spec[field] >= 0, field
    # At zero workers nobody runs rq's scheduler, and delayed requeues would never run.
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert set(spec["fallback"]) == {"failureThreshold", "replicas"}
    assert set(spec["advanced"]) <= {
        "horizontalPodAutoscalerConfig",
        "restoreToOriginalReplicaCount",
    }
    (trigger,) = spec["triggers"]
    assert set(trigger) <= {"type", "name", "metadata", "authenticationRef", "metricType"}
    assert trigger["type"] == "redis"
    metadata = trigger["metadata"]
    assert set(metadata) <= REDIS_TRIGGER_METADATA
    # KEDA reads every metadata value as a string.
    assert all(isinstance(value, str) for value in metadata.values()), metadata
    assert metadata["listName"] == Queue.redis_queue_namespace_prefix + "agents"
    assert int(metadata["listLength"]) >= 1
    # The ScaledObject owns the replica count; a fixed one would fight it on every apply.
    assert "replicas" not in objects("Deployment")["worker"]["spec"]


# --- cross-checks against the code ------------------------------------------------------------


def test_every_variable_is_one_the_process_reads() -> None:
    for name, container in containers():
        known = MCP_SERVER_VARIABLES.get(name, SETTINGS_VARIABLES | RQ_VARIABLES)
        assert env_names(container) <= known, (name, env_names(container) - known)


def test_each_process_gets_only_its_own_secrets() -> None:
    secrets = objects("Secret")
    for name, container in containers():
        refs = secret_refs(container)
        assert {ref["name"] for ref in refs} == {f"{name}-secrets"}, name
        required = {ref["variable"] for ref in refs if not ref.get("optional")}
        assert required == SECRETS_OF[name], name
        optional = {ref["variable"] for ref in refs if ref.get("optional")}
        assert optional == (PROVIDER_KEYS if name == "worker" else set()), name
        for ref in refs:
            assert ref["key"] == ref["variable"]
            if not ref.get("optional"):
                assert ref["key"] in secrets[ref["name"]]["stringData"], ref
        # Nothing secret arrives as a plain value or through a ConfigMap.
        plain = env_names(container) - {ref["variable"] for ref in refs}
        assert not plain & (SECRETS_OF["worker"] | PROVIDER_KEYS), (name, plain)


def test_commands_and_image_are_the_procfiles() -> None:
    processes = procfile()
    for name, container in containers():
        assert container["image"] == "hub-agent-worker", name
        command = list(container["command"])
        if "--host" in command:  # beyond loopback inside the cluster, as compose does
            at = command.index("--host")
            del command[at : at + 2]
        expected = [word for word in processes[name] if "=" not in word]
        assert command == expected, name
        for assignment in (word for word in processes[name] if "=" in word):
            variable, _, value = assignment.partition("=")
            assert env_value(container, variable) == value, (name, variable)


def test_ports_and_probes_match_the_defaults() -> None:
    deployments = objects("Deployment")
    services = objects("Service")
    worker = deployments["worker"]["spec"]["template"]["spec"]["containers"][0]
    metrics_port = Settings.model_fields["metrics_port"].default
    assert env_value(worker, "METRICS_PORT") == str(metrics_port)
    assert worker["ports"] == [{"name": "metrics", "containerPort": metrics_port}]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert worker[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    assert services["worker-metrics"]["spec"]["ports"][0]["port"] == metrics_port
    for name in ("mcp-hub", "mcp-web", "mcp-memory"):
        container = deployments[name]["spec"]["template"]["spec"]["containers"][0]
        default_port = int(procfile()[name][procfile()[name].index("--port") + 1])
        command = container["command"]
        assert int(command[command.index("--port") + 1]) == default_port, name
        assert container["ports"] == [{"name": "mcp", "containerPort": default_port}]
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["tcpSocket"] == {"port": "mcp"}, (name, probe)
        assert services[name]["spec"]["ports"][0]["port"] == default_port


def test_selectors_of_services_and_disruption_budgets_match_their_pods() -> None:
    labels = {
        name: d["spec"]["template"]["metadata"]["labels"]
        for name, d in objects("Deployment").items()
    }
    for name, deployment in objects("Deployment").items():
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels[name].items()
    for service in objects("Service").values():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= pod.items() for pod in labels.values()), service
    budgets = objects("PodDisruptionBudget")
    assert set(budgets) == {"worker", "mcp-hub", "mcp-web", "mcp-memory"}
    for name, budget in budgets.items():
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels[name].items()


def materialise_volume(volume: dict[str, Any], directory: Path) -> Path:
    """Write a ConfigMap volume's files as the kubelet would (its ``items`` paths)."""
    data = objects("ConfigMap")[volume["configMap"]["name"]]["data"]
    items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        path = directory / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[item["key"]])
    return directory


def pod_files(deployment: str, tmp_path: Path) -> dict[str, Path]:
    """Each ConfigMap volume of a Deployment, materialised, by its mount path."""
    spec = objects("Deployment")[deployment]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"] if "configMap" in v}
    mounts = {}
    for mount in spec["containers"][0]["volumeMounts"]:
        if mount["name"] in volumes:
            target = tmp_path / mount["name"]
            mounts[mount["mountPath"]] = materialise_volume(volumes[mount["name"]], target)
    return mounts


def test_the_grace_period_covers_the_longest_task_deadline(tmp_path: Path) -> None:
    spec = objects("Deployment")["worker"]["spec"]["template"]["spec"]
    worker = spec["containers"][0]
    mounts = pod_files("worker", tmp_path)
    agents_dir = mounts[env_value(worker, "AGENTS_DIR") or ""]
    store = AgentStore(str(agents_dir), policy=DefinitionPolicy())
    deadlines = [DEFAULT_MAX_DURATION_S]
    for config in (agents_dir / "agents").glob("*/config.yaml"):
        deadlines.append(store.load(config.parent.name).config.limits.max_duration_s)
    grace = int(
        env_value(worker, "JOB_TIMEOUT_GRACE_S")
        or Settings.model_fields["job_timeout_grace_s"].default
    )
    assert spec["terminationGracePeriodSeconds"] >= max(deadlines) + grace


def test_mcp_config_and_grant_policy_parse_and_point_at_the_services(tmp_path: Path) -> None:
    worker = objects("Deployment")["worker"]["spec"]["template"]["spec"]["containers"][0]
    mounts = pod_files("worker", tmp_path)

    def mounted(variable: str) -> Path:
        path = Path(env_value(worker, variable) or "")
        return mounts[str(path.parent)] / path.name

    config = load_mcp_config(mounted("MCP_CONFIG"))
    # The compose deployment's policy, scope opt-ins included: one fleet, one cap.
    policy = load_grant_policy(mounted("GRANT_POLICY"))
    assert policy == load_grant_policy(REPO_ROOT / "deploy" / "grant-policy.yaml")
    services = objects("Service")
    urls = {name: server.url for name, server in config.servers.items()}
    assert urls == {
        name: f"http://mcp-{name}:{services[f'mcp-{name}']['spec']['ports'][0]['port']}/mcp"
        for name in ("hub", "web", "memory")
    }


def test_the_memory_server_reads_the_definitions_the_worker_reads(tmp_path: Path) -> None:
    def definitions(deployment: str) -> dict[str, str]:
        spec = objects("Deployment")[deployment]["spec"]["template"]["spec"]
        agents_dir = env_value(spec["containers"][0], "AGENTS_DIR") or ""
        root = pod_files(deployment, tmp_path / deployment)[agents_dir]
        return {
            str(path.relative_to(root)): path.read_text()
            for path in root.rglob("*")
            if path.is_file()
        }

    assert definitions("mcp-memory") == definitions("worker") != {}


def test_the_worker_pod_lets_the_cli_sandbox_create_its_namespaces() -> None:
    """bwrap needs user namespaces without host privilege, a /proc it may mount, and a
    seccomp/AppArmor profile that allows unshare (docs/how-to/cli-agent.md, "What the host
    must allow")."""
    spec = objects("Deployment")["worker"]["spec"]["template"]["spec"]
    security = spec["containers"][0]["securityContext"]
    assert spec["hostUsers"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert security["procMount"] == "Unmasked"
    assert security["seccompProfile"] == {"type": "Unconfined"}
    assert security["appArmorProfile"] == {"type": "Unconfined"}
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_the_scaled_object_reads_the_redis_that_redis_url_names() -> None:
    # KEDA takes host:port and a database index: they must repeat REDIS_URL (one Redis).
    (scaled,) = objects("ScaledObject").values()
    metadata = scaled["spec"]["triggers"][0]["metadata"]
    redis_url = urlsplit(objects("ConfigMap")["fleet-env"]["data"]["REDIS_URL"])
    assert metadata["address"] == f"{redis_url.hostname}:{redis_url.port or 6379}"
    assert metadata["databaseIndex"] == (redis_url.path.strip("/") or "0")
