"""The configuration half of ``agent-worker check``: the files an operator wrote.

``AGENTS_DIR`` and every definition in it (as ``AgentStore.load`` reads it), the skills,
``MCP_CONFIG`` (stdio commands on ``PATH``; HTTP servers answering an MCP ``initialize``),
``GRANT_POLICY`` and ``PRICES_FILE``. Each check adds its findings to the report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from worker.agents import AgentDefinition, AgentStore
from worker.exceptions import ConfigurationError, WorkerError
from worker.operations._check_report import CheckReport
from worker.operations._checks_network import probe_mcp_server
from worker.settings import Settings


def _agents_root(report: CheckReport, source: str) -> Path | None:
    """The AGENTS_DIR directory when it has the expected layout and can be read; None (and
    why, in one line naming AGENTS_DIR) otherwise."""
    root = Path(source).expanduser().absolute()
    try:
        return _readable_layout(report, root)
    except OSError as exc:  # a directory on the way this process may not enter or list
        where = exc.filename or root
        report.error("AGENTS_DIR", f"{where} cannot be read ({exc.strerror or exc})")
        return None


def _readable_layout(report: CheckReport, root: Path) -> Path | None:
    if not root.exists():
        report.error("AGENTS_DIR", f"{root} does not exist")
        return None
    if not root.is_dir():
        report.error("AGENTS_DIR", f"{root} is not a directory")
        return None
    if not (root / "agents").is_dir():
        if any((child / "config.yaml").is_file() for child in root.iterdir() if child.is_dir()):
            report.error(
                "AGENTS_DIR",
                f"{root} holds <name>/config.yaml directly; point AGENTS_DIR at its parent "
                "(the layout is AGENTS_DIR/agents/<name>/config.yaml)",
            )
        else:
            # An empty definitions tree is a fleet without agents yet, not a broken one.
            report.warning("AGENTS_DIR", f"{root} has no agents/<name>/config.yaml yet")
        return None
    os.listdir(root / "agents")  # unreadable, it would look empty: say so instead
    return root


def check_agents(
    report: CheckReport, config: Settings, cache: Redis | None = None
) -> dict[str, AgentDefinition]:
    """Load every definition as a task would; returns those that loaded, by agent id."""
    if config.agents_dir.lower().startswith(("http://", "https://")):
        report.checked.append("AGENTS_DIR is a URL: definitions are read when a task names them")
        return {}
    root = _agents_root(report, config.agents_dir)
    if root is None:
        return {}
    ttl_s = config.agent_cache_ttl_s if cache is not None else 0
    try:
        store = AgentStore(str(root), redis=cache, ttl_s=ttl_s)
    except ConfigurationError:
        # Loading applies GRANT_POLICY, which cannot be read: check_grant_policy says why.
        return {}
    names = store.list_agents()
    if not names:
        report.warning("AGENTS_DIR", f"no agents/<name>/config.yaml under {root}")
    loaded = {}
    try:
        for name in names:
            definition = _check_definition(report, store, name)
            if definition is not None:
                loaded[name] = definition
    finally:
        store.close()
    report.checked.append(f"{len(loaded)} of {len(names)} agent definitions load")
    return loaded


def _check_definition(report: CheckReport, store: AgentStore, name: str) -> AgentDefinition | None:
    config_file = f"agents/{name}/config.yaml"
    # The files are checked, not what an earlier read cached. Without Redis the cache
    # cannot be read either, and load reads the files.
    with contextlib.suppress(RedisError):
        store.invalidate(name)
    try:
        definition = store.load(name)
    except WorkerError as exc:
        report.error(config_file, _without_prefix(exc.message, config_file), agent=name)
        return None
    # Unknown keys and the like: the definition loads, but something in it is ignored.
    for warning in definition.warnings:
        report.warning(config_file, _without_prefix(str(warning), config_file), agent=name)
    return definition


def check_skills(report: CheckReport, config: Settings) -> None:
    """Every ``skills/<name>/`` has a readable SKILL.md, also those no agent lists yet."""
    from worker.agents import parse_skill

    root = Path(config.agents_dir).expanduser().absolute() / "skills"
    # An AGENTS_DIR that cannot be entered is one error already (check_agents).
    if config.agents_dir.lower().startswith(("http://", "https://")) or not os.access(
        root.parent, os.R_OK | os.X_OK
    ):
        return
    try:
        if not root.is_dir():
            return
        folders = sorted(child for child in root.iterdir() if child.is_dir())
    except OSError as exc:
        report.error("AGENTS_DIR", f"{root} cannot be read ({exc.strerror or exc})")
        return
    count = 0
    for folder in folders:
        skill_file = f"skills/{folder.name}/SKILL.md"
        try:
            parse_skill((folder / "SKILL.md").read_bytes(), skill_file)
        except FileNotFoundError:
            report.warning(f"skills/{folder.name}", "has no SKILL.md")
            continue
        except OSError as exc:
            report.error(skill_file, f"cannot be read ({exc.strerror or exc})")
            continue
        except WorkerError as exc:
            report.error(skill_file, _without_prefix(exc.message, skill_file))
            continue
        count += 1
    report.checked.append(f"{count} skills parse")


def check_mcp_config(
    report: CheckReport,
    config: Settings,
    agents: Mapping[str, AgentDefinition],
    *,
    network: bool,
    timeout_s: float,
) -> None:
    from worker.tools import load_mcp_config

    if config.mcp_config is None:
        report.checked.append("MCP_CONFIG unset: agents run without tools")
        return
    subject = f"MCP_CONFIG ({config.mcp_config})"
    try:
        mcp = load_mcp_config(config.mcp_config)
    except ConfigurationError as exc:
        report.error("MCP_CONFIG", _without_prefix(exc.message, str(config.mcp_config)))
        return
    token = config.mcp_auth_token.get_secret_value() if config.mcp_auth_token else None
    for name, server in mcp.servers.items():
        where = f"{subject}: servers.{name}"
        if server.command is not None:
            path = server.env["PATH"].get_secret_value() if "PATH" in server.env else None
            problem = _missing_command(server.command, path, server.cwd)
            if problem:
                report.error(f"{where}.command", problem)
        elif network and server.url is not None:
            # Only what the toolbox would send: MCP_AUTH_TOKEN to first-party servers only.
            headers = server.http_headers(token)
            sent = token if token and headers.get("Authorization") == f"Bearer {token}" else None
            problem = probe_mcp_server(server.url, headers, sent, timeout_s=timeout_s)
            if problem:
                report.warning(f"{where}.url", problem)
    report.checked.append(f"{len(mcp.servers)} MCP servers configured")
    _check_agent_servers(report, agents, set(mcp.servers))


def _missing_command(command: str, path: str | None, cwd: Path | None) -> str | None:
    """Why ``command`` would not start, as the toolbox spawns it; None when it would."""
    if os.sep in command:
        candidate = Path(command) if cwd is None else Path(cwd) / command
        if not candidate.is_file() or not os.access(candidate, os.X_OK):
            return f"{command!r} is not an executable file"
        return None
    search_path = path if path is not None else os.environ.get("PATH", os.defpath)
    if shutil.which(command, path=search_path) is None:
        return f"{command!r} not found on PATH"
    return None


def _check_agent_servers(
    report: CheckReport, agents: Mapping[str, AgentDefinition], servers: set[str]
) -> None:
    """An agent's ``capabilities.mcp_servers`` naming a server MCP_CONFIG lacks."""
    for name, definition in agents.items():
        for server in sorted(set(definition.config.capabilities.server_names) - servers):
            report.warning(
                f"agents/{name}/config.yaml",
                f"capabilities.mcp_servers: {server!r} is not in MCP_CONFIG",
                agent=name,
            )


def check_grant_policy(
    report: CheckReport, config: Settings, agents: Mapping[str, AgentDefinition]
) -> None:
    from worker.tools import load_grant_policy

    if config.grant_policy is None:
        return
    try:
        policy = load_grant_policy(config.grant_policy)
    except ConfigurationError as exc:
        report.error("GRANT_POLICY", _without_prefix(exc.message, str(config.grant_policy)))
        return
    if agents:
        for unknown in sorted(set(policy.agents) - set(agents)):
            report.warning(
                f"GRANT_POLICY ({config.grant_policy})", f"agents.{unknown}: no such agent"
            )
    report.checked.append("GRANT_POLICY parses")


def check_prices(report: CheckReport, config: Settings) -> None:
    from worker.models import load_price_table

    if config.prices_file is None:
        return
    try:
        load_price_table(config)
    except WorkerError as exc:
        report.error("PRICES_FILE", _without_prefix(exc.message, str(config.prices_file)))


def _without_prefix(message: str, subject: str) -> str:
    # Messages already name their file; the line names it once, as its subject.
    return message.removeprefix(f"{subject}: ").removeprefix(f"{subject}:")
