"""The Botburrow-format half of ``agent-worker check``: what a definition asks for that this
worker does otherwise, and every effective value of each agent (``check --json``).

    warning: agents/ops/config.yaml: version: 2.0.0 is schema major version 2; ...
    warning: agents/ops/config.yaml: capabilities.mcp_servers.1: inline entry 'k8s' ...
    warning: agents/ops/config.yaml: capabilities.shell.enabled: a native agent has no shell ...
    warning: agents/ops/config.yaml: capabilities.spawning.can_propose: this worker never ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.agents import AgentDefinition, InlineMcpServer
from worker.operations._check_report import CheckReport

# The major version of the public agent-definitions schema this worker reads.
SCHEMA_MAJOR_VERSION = 1


def check_definition_format(report: CheckReport, agents: Mapping[str, AgentDefinition]) -> None:
    """Warn where a loaded definition will not do what it says here; keep each agent's
    effective values (schema defaults applied) for ``--json``."""
    for name, definition in sorted(agents.items()):
        where = f"agents/{name}/config.yaml"
        _check_version(report, definition, where)
        _check_inline_servers(report, definition, where)
        _check_declined(report, definition, where)
        report.effective_agents[name] = effective_values(definition)


def effective_values(definition: AgentDefinition) -> dict[str, Any]:
    """Every value the worker runs the agent with, defaults filled in. The nested
    notification switches are folded into the flat ones; inline server ``env`` values
    (which may hold credentials) are not shown."""
    values = definition.config.model_dump(mode="json", exclude={"behavior": {"notifications"}})
    for entry in values["capabilities"]["mcp_servers"]:
        if isinstance(entry, dict):
            entry["env"] = sorted(entry["env"])
    return values


def _check_version(report: CheckReport, definition: AgentDefinition, where: str) -> None:
    version = definition.config.version
    if version is None or int(version.split(".")[0]) == SCHEMA_MAJOR_VERSION:
        return
    report.warning(
        where,
        f"version: {version} is schema major version {version.split('.')[0]}; this worker "
        f"reads version {SCHEMA_MAJOR_VERSION}.x.y, so some keys may mean something else",
        agent=definition.config.name,
    )


def _check_inline_servers(report: CheckReport, definition: AgentDefinition, where: str) -> None:
    for index, entry in enumerate(definition.config.capabilities.mcp_servers):
        if isinstance(entry, InlineMcpServer):
            report.warning(
                where,
                f"capabilities.mcp_servers.{index}: inline entry {entry.name!r} is not started "
                f"(its command {entry.command!r} is ignored): MCP_CONFIG decides what runs, "
                f"and the agent gets MCP_CONFIG's server {entry.name!r} if there is one",
                agent=definition.config.name,
            )


def _check_declined(report: CheckReport, definition: AgentDefinition, where: str) -> None:
    """Keys that load but ask for what this worker does not do for that agent."""
    config = definition.config
    if config.type == "native" and config.capabilities.shell.enabled:
        report.warning(
            where,
            "capabilities.shell.enabled: a native agent has no shell here (only a coding-agent "
            "CLI type runs commands, in its sandbox); its tools are MCP_CONFIG's servers",
            agent=config.name,
        )
    if config.capabilities.spawning.can_propose:
        report.warning(
            where,
            "capabilities.spawning.can_propose: this worker never creates or proposes agents "
            "(definitions come only from AGENTS_DIR); the key is ignored",
            agent=config.name,
        )
