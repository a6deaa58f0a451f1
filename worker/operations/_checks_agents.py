"""The part of ``agent-worker check`` that asks, per agent: would its tasks run at all?

- its model: the provider key it needs is set (``brain.api_key_env``, else the worker's
  ``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY``), and its endpoint answers and accepts the key;
- its memory: ``embedding_search`` has an embeddings endpoint (else keyword, warned); a
  ``memory:read``/``memory:write`` grant comes with ``memory.enabled`` (the memory MCP
  server answers every call of an agent without memory with an error);
- its grants: each one matches at least one tool of an ``MCP_CONFIG`` server (``hub:raed``
  leaves the agent without the tools it was meant to have, silently);
- the worker's secrets: none is so short or plain that masking it corrupts ordinary text
  (the redactor blanks every occurrence of a secret's value, in any letter case);
- its task scope: each opt-in of the definition's ``scope`` section widens what every task
  of the agent may write beyond the narrow default, so each is shown (docs/task-scope.md).

An endpoint that does not answer is a warning, as an MCP server or the Hub is (it may start
after the worker); a missing key or a refused one is an error of that agent.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import replace

import httpx2

from hub_client.retry_rules import Failure, classify_status
from worker._network import client_ssl_context, shown_url
from worker.agents import AgentDefinition, RecallStrategy
from worker.exceptions import ConfigurationError, WorkerError
from worker.operations._check_report import CheckReport, Problem, Severity
from worker.settings import Settings

# What the memory MCP server's tools require (mcp_servers.memory.TOOL_GRANTS).
MEMORY_TOOL_GRANTS = ("memory:read", "memory:write")
# Below this many letters and digits, a secret's value is likely to occur in ordinary text.
MIN_SECRET_CHARACTERS = 16
_SDK_KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def check_models(
    report: CheckReport,
    config: Settings,
    agents: Mapping[str, AgentDefinition],
    *,
    network: bool,
    timeout_s: float,
) -> None:
    """Each agent's key is set; with ``network``, each endpoint (probed once) answers."""
    from worker.executors import provider_access
    from worker.models import PROVIDERS

    probed: dict[tuple[str, str | None, str, str], Problem | None] = {}
    for name, definition in agents.items():
        where = f"agents/{name}/config.yaml"
        brain = definition.config.brain
        named = {brain.provider, *(fallback.provider for fallback in brain.fallbacks)}
        report.providers.update(named & PROVIDERS)  # an unknown one is reported below
        try:
            access = provider_access(definition, config)
        except WorkerError as exc:
            report.error(where, f"brain: {exc.message.removeprefix(f'{where}: ')}", agent=name)
            continue
        if not network:
            continue
        key_variable = definition.config.brain.api_key_env or _SDK_KEY_VARIABLES.get(
            access.provider, "its key"
        )
        endpoint = (access.provider, access.base_url, access.api_key, key_variable)
        if endpoint not in probed:
            probed[endpoint] = _probe_model_endpoint(*endpoint, timeout_s=timeout_s)
        problem = probed[endpoint]
        if problem is not None:
            report.problems.append(replace(problem, subject=where, agent=name))


def _probe_model_endpoint(
    provider: str, base_url: str | None, api_key: str, key_variable: str, *, timeout_s: float
) -> Problem | None:
    """List the provider's models: any answer but 401/403 means the endpoint is there."""
    if provider == "anthropic":
        root = (base_url or "https://api.anthropic.com").rstrip("/")
        url = f"{root}/v1/models"
        headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
    else:
        root = (base_url or "https://api.openai.com/v1").rstrip("/")
        url = f"{root}/models"
        headers = {"Authorization": f"Bearer {api_key}"}
    try:
        with httpx2.Client(
            timeout=timeout_s, verify=client_ssl_context(), trust_env=False
        ) as client:
            status = client.get(url, headers=headers).status_code
    except httpx2.HTTPError as exc:
        message = f"brain: the model endpoint {shown_url(root)} does not answer"
        return Problem(
            severity=Severity.WARNING, subject="", message=f"{message} ({type(exc).__name__})"
        )
    if classify_status(status) is Failure.AUTH:
        message = f"brain: the model endpoint {shown_url(root)} refuses {key_variable}"
        return Problem(severity=Severity.ERROR, subject="", message=f"{message} (HTTP {status})")
    return None


def check_grants_match_tools(
    report: CheckReport, config: Settings, agents: Mapping[str, AgentDefinition]
) -> None:
    """A requested grant that no tool of any MCP_CONFIG server requires is a typo, or a
    server missing from MCP_CONFIG: either way the agent runs without those tools."""
    from worker.tools import grant_covers, load_mcp_config

    if config.mcp_config is None or not agents:
        return
    try:
        mcp = load_mcp_config(config.mcp_config)
    except ConfigurationError:
        return  # check_mcp_config has said why
    required = sorted({grant for server in mcp.servers.values() for grant in server.tools.values()})
    for name, definition in agents.items():
        for grant in definition.config.capabilities.grants:
            if any(grant_covers(grant, tool_grant) for tool_grant in required):
                continue
            close = closest_grant(grant, required)
            hint = f" (did you mean {close!r}?)" if close else ""
            report.warning(
                f"agents/{name}/config.yaml",
                f"capabilities.grants: {grant!r} matches no tool of any MCP_CONFIG server{hint}",
                agent=name,
            )


def closest_grant(grant: str, candidates: list[str]) -> str | None:
    """The grant ``grant`` is probably a typo of: one part the same and the other close
    (``hub:raed`` → ``hub:read``, ``hbu:read`` → ``hub:read``), never a grant of another
    service that only shares the scope (``kubernetes:read``, ``github:read``: not ``hub:read``)."""
    service, _, scope = grant.partition(":")

    def close(a: str, b: str) -> bool:  # a slip of a key or two, not another word
        return abs(len(a) - len(b)) <= 2 and difflib.SequenceMatcher(None, a, b).ratio() >= 0.6

    fitting = []
    for candidate in candidates:
        other_service, _, other_scope = candidate.partition(":")
        if (service == other_service and close(scope, other_scope)) or (
            scope == other_scope and close(service, other_service)
        ):
            fitting.append(candidate)
    best = difflib.get_close_matches(grant, fitting, n=1, cutoff=0)
    return best[0] if best else None


def check_memory(
    report: CheckReport, config: Settings, agents: Mapping[str, AgentDefinition]
) -> None:
    """An agent whose memory searches by embedding needs MEMORY_EMBEDDINGS_URL; without it
    its tasks search by keyword, which the operator should know before they run. An agent
    granted the memory tools needs a memory for them to work on."""
    from worker.tools import grant_covers  # as check_grants_match_tools: only when checking

    for name, definition in agents.items():
        memory = definition.config.memory
        granted = sorted(
            grant
            for grant in definition.config.capabilities.grants
            if any(grant_covers(grant, required) for required in MEMORY_TOOL_GRANTS)
        )
        if granted and not memory.enabled:
            report.warning(
                f"agents/{name}/config.yaml",
                f"capabilities.grants: {', '.join(granted)} without memory.enabled: the "
                "memory server answers this agent's calls with an error",
                agent=name,
            )
        if config.memory_embeddings_url is not None:
            continue
        if memory.enabled and memory.retrieval.strategy is RecallStrategy.EMBEDDING_SEARCH:
            report.warning(
                f"agents/{name}/config.yaml",
                "memory.retrieval.strategy: embedding_search needs MEMORY_EMBEDDINGS_URL, "
                "which is not set: this agent's memory is searched by keyword instead",
                agent=name,
            )


def check_task_scope(report: CheckReport, agents: Mapping[str, AgentDefinition]) -> None:
    """A widened scope is the operator's explicit choice: shown at every check."""
    for name, definition in agents.items():
        for opt_in in definition.config.scope.widened:
            report.warning(
                f"agents/{name}/config.yaml",
                f"widened scope: {opt_in} (its tasks may write beyond the thread or feed "
                "they were given; an injected instruction may use that too)",
                agent=name,
            )


def check_private_reach(
    report: CheckReport, config: Settings, agents: Mapping[str, AgentDefinition]
) -> None:
    """For each agent with a tool whose argument leaves the worker (our fetch, a third-party
    tool): when its tasks are private, and where their reads may then go."""
    from worker.tools import grant_covers, load_mcp_config

    if config.mcp_config is None:
        return
    try:
        mcp = load_mcp_config(config.mcp_config)
    except ConfigurationError:
        return  # check_mcp_config has said why
    allow = ", ".join(config.egress_allow) or "nothing more"
    unmarked = "" if config.unmarked_posts == "public" else " or does not mark"
    for name, definition in sorted(agents.items()):
        capabilities = definition.config.capabilities
        servers = set(capabilities.server_names) or set(mcp.servers)
        reaches: list[str] = []
        for server_name, server in sorted(mcp.servers.items()):
            if server_name not in servers or server_name == config.hub_tool_server:
                continue
            for tool, grant in sorted(server.tools.items()):
                if not any(grant_covers(held, grant) for held in capabilities.grants):
                    continue
                label = f"{server_name}__{tool}"
                if server_name == config.web_tool_server:
                    reaches.append(
                        f"{label} loads the person's own links and EGRESS_ALLOW ({allow})"
                    )
                elif server.first_party:
                    continue
                elif tool in server.scope:
                    reaches.append(f"{label} only within its MCP_CONFIG argument rule")
                elif server.open_to_private(tool):
                    reaches.append(f"{label} unbounded (private_ok)")
                else:
                    reaches.append(f"{label} withheld")
        if not reaches:
            continue
        if definition.config.scope.private:
            when = "every task (scope.private)"
        elif {"*", name} & set(config.private_agents):
            when = "every task (PRIVATE_AGENTS)"
        else:
            when = (
                f"direct messages, threads the Hub calls not public{unmarked}, and tasks that "
                "recall a private memory"
            )
        report.reach.append(f"{name}: private in {when}; there {'; '.join(reaches)}")


def check_secret_strength(report: CheckReport, config: Settings) -> None:
    """Warn about a secret the redactor would find inside ordinary words."""
    for variable, value in _secrets_by_variable(config).items():
        characters = [character for character in value if character.isalnum()]
        if len(characters) < MIN_SECRET_CHARACTERS or all(c.isalpha() for c in characters):
            report.warning(
                variable,
                "is short or plain words: every occurrence of its value is masked in posts, "
                "logs and reports, so ordinary text that contains it is corrupted; use a "
                f"random value of at least {MIN_SECRET_CHARACTERS} letters and digits",
            )


def _secrets_by_variable(config: Settings) -> dict[str, str]:
    secrets = {
        "HUB_API_KEY": config.hub_api_key,
        "MCP_AUTH_TOKEN": config.mcp_auth_token,
        "REDIS_SENTINEL_PASSWORD": config.redis_sentinel_password,
        "CAPABILITY_KEY": config.capability_key,
        "ANTHROPIC_API_KEY": config.anthropic_api_key,
        "OPENAI_API_KEY": config.openai_api_key,
    }
    found = {name: secret.get_secret_value() for name, secret in secrets.items() if secret}
    for name in config.agent_key_envs:
        if os.environ.get(name):
            found[name] = os.environ[name]
    return {name: value for name, value in found.items() if value}
