"""``agent-worker check``: is this host's configuration ready to run agents?

Checks, in order: the settings, Redis, ``AGENTS_DIR`` and every definition in it
(as ``AgentStore.load`` reads it, with its warnings), the skills, ``MCP_CONFIG``
(stdio commands on ``PATH``; HTTP servers answering an MCP ``initialize``),
``GRANT_POLICY``, ``PRICES_FILE`` and the Hub at ``HUB_URL``. Each problem is one
line naming the variable, file or field::

    error: AGENTS_DIR: /srv/agents does not exist
    warning: agents/helper/config.yaml: unknown key 'behaviour' (did you mean 'behavior'?)

Errors are what makes tasks fail; warnings are what an operator should look at
(an MCP server or the Hub not answering right now is a warning: they may start
after the worker). ``AgentWorker`` runs the same checks at start and refuses to
start on an error that concerns the whole fleet; an error in one agent's
definition is logged and fails only that agent's tasks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from worker._checks_network import probe_hub, probe_mcp_server, probe_redis
from worker.agents import AgentDefinition, AgentStore
from worker.cli import redis_url_parser
from worker.exceptions import ConfigurationError, WorkerError
from worker.settings import Settings, load_settings

DEFAULT_TIMEOUT_S = 3.0


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One finding; ``agent`` is set when it concerns only that agent's tasks."""

    severity: Severity
    subject: str
    message: str
    agent: str | None = None

    def line(self) -> str:
        return f"{self.severity.value}: {self.subject}: {self.message}"


@dataclass(kw_only=True)
class CheckReport:
    problems: list[Problem] = field(default_factory=list)
    # What was looked at and found in order, e.g. "3 agents", for the summary line.
    checked: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.WARNING]

    def error(self, subject: str, message: str, *, agent: str | None = None) -> None:
        self.problems.append(
            Problem(severity=Severity.ERROR, subject=subject, message=message, agent=agent)
        )

    def warning(self, subject: str, message: str, *, agent: str | None = None) -> None:
        self.problems.append(
            Problem(severity=Severity.WARNING, subject=subject, message=message, agent=agent)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.errors,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [asdict(problem) for problem in self.problems],
            "checked": self.checked,
        }


def run_checks(
    config: Settings,
    *,
    redis: bool = True,
    network: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    agent_cache: Redis | None = None,
) -> CheckReport:
    """Every check on already loaded settings; ``network=False`` skips the Hub and MCP probes.

    ``agent_cache``: the worker's Redis, where the definitions the check reads are cached
    for the tasks that follow (the files are still read, never an older cache entry).
    """
    report = CheckReport()
    if redis:
        _check_redis(report, config, timeout_s)
    agents = _check_agents(report, config, agent_cache)
    _check_skills(report, config)
    _check_mcp_config(report, config, agents, network=network, timeout_s=timeout_s)
    _check_grant_policy(report, config, agents)
    _check_prices(report, config)
    if network:
        _check_hub(report, config, timeout_s)
    return report


# --- each part ---------------------------------------------------------------------------------


def _check_redis(report: CheckReport, config: Settings, timeout_s: float) -> None:
    client = None
    if config.redis_sentinels:
        from worker.redis_connection import connect

        client = connect(config)  # the primary the sentinels name, as the worker finds it
    problem = probe_redis(config.redis_url, timeout_s=timeout_s, client=client)
    if problem is None:
        report.checked.append("Redis answers")
    else:
        report.error("REDIS_URL", problem)


def _agents_root(report: CheckReport, source: str) -> Path | None:
    """The AGENTS_DIR directory when it has the expected layout; None (and why) otherwise."""
    root = Path(source).expanduser().absolute()
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
    return root


def _check_agents(
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
    store = AgentStore(str(root), redis=cache, ttl_s=ttl_s)
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


def _check_skills(report: CheckReport, config: Settings) -> None:
    """Every ``skills/<name>/`` has a readable SKILL.md, also those no agent lists yet."""
    from worker.agents import parse_skill

    root = Path(config.agents_dir).expanduser().absolute() / "skills"
    if config.agents_dir.lower().startswith(("http://", "https://")) or not root.is_dir():
        return
    count = 0
    for folder in sorted(child for child in root.iterdir() if child.is_dir()):
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


def _check_mcp_config(
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
        for server in sorted(set(definition.config.capabilities.mcp_servers) - servers):
            report.warning(
                f"agents/{name}/config.yaml",
                f"capabilities.mcp_servers: {server!r} is not in MCP_CONFIG",
                agent=name,
            )


def _check_grant_policy(
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


def _check_prices(report: CheckReport, config: Settings) -> None:
    from worker.models import load_price_table

    if config.prices_file is None:
        return
    try:
        load_price_table(config)
    except WorkerError as exc:
        report.error("PRICES_FILE", _without_prefix(exc.message, str(config.prices_file)))


def _check_hub(report: CheckReport, config: Settings, timeout_s: float) -> None:
    key = config.hub_api_key.get_secret_value() if config.hub_api_key else None
    problem = probe_hub(config.hub_url, key, timeout_s=timeout_s)
    if problem is None:
        report.checked.append("the Hub answers")
    else:
        report.warning("HUB_URL", problem)


def _without_prefix(message: str, subject: str) -> str:
    # Messages already name their file; the line names it once, as its subject.
    return message.removeprefix(f"{subject}: ").removeprefix(f"{subject}:")


# --- the command -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-worker check",
        description="Check settings, Redis, agent definitions, MCP servers, grants and the Hub.",
        parents=[redis_url_parser()],
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="check files and settings only: no Redis, Hub or MCP probe",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="per probe (default %(default)s)",
    )
    return parser


def main(argv: list[str]) -> int:
    """``agent-worker check``: 0 when all is well, 1 on an error (or a warning with --strict)."""
    args = _parser().parse_args(argv)
    if args.redis_url:
        os.environ["REDIS_URL"] = args.redis_url
    try:
        config = load_settings()
    except ConfigurationError as exc:
        report = CheckReport()
        variable, _, message = exc.message.removeprefix("invalid setting ").partition(": ")
        report.error(variable, message or exc.message)
    else:
        online = not args.offline
        report = run_checks(config, redis=online, network=online, timeout_s=args.timeout)
    _print(report, as_json=args.json)
    failed = bool(report.errors) or (args.strict and bool(report.warnings))
    return 1 if failed else 0


def _print(report: CheckReport, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    for problem in report.problems:
        print(problem.line())
    summary = [f"{len(report.errors)} errors, {len(report.warnings)} warnings", *report.checked]
    print("check: " + "; ".join(summary))


def check_at_start(
    config: Settings, *, timeout_s: float = 2.0, agent_cache: Redis | None = None
) -> None:
    """What ``AgentWorker`` runs before taking work: log warnings and agent errors, and stop
    with one ``agent-worker: error: ...`` line per fleet-wide error (exit status 2).

    With ``agent_cache`` (the worker's Redis) the definitions it reads are cached for the
    first tasks: each is read, and its warnings logged, once at start.
    """
    from worker.logs import log_event

    # No Redis probe: rq's CLI has already asked the worker's Redis whether it is suspended.
    report = run_checks(
        config, redis=False, network=True, timeout_s=timeout_s, agent_cache=agent_cache
    )
    fatal = [p for p in report.errors if p.agent is None]
    for problem in report.problems:
        if problem not in fatal:
            log_event(
                "config_problem",
                level=problem.severity.value,
                subject=problem.subject,
                problem=problem.message,
                agent=problem.agent,
            )
    if fatal:
        for problem in fatal:
            print(f"agent-worker: {problem.line()}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
