"""``agent-worker check``: is this host's configuration ready to run agents?

Checks, in order: the settings, Redis, ``AGENTS_DIR`` and every definition in it
(as ``AgentStore.load`` reads it, with its warnings), the skills, ``MCP_CONFIG``
(stdio commands on ``PATH``; HTTP servers answering an MCP ``initialize``),
``GRANT_POLICY``, ``PRICES_FILE``, each agent's model (its key set, its endpoint
answering), grants that match no tool, secrets too plain to mask safely, and the Hub at
``HUB_URL``. Each problem is one
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
import json
import sys

from redis import Redis

from worker.agents import AgentDefinition
from worker.exceptions import ConfigurationError
from worker.logs import only_at_least
from worker.operations._check_report import CheckReport
from worker.operations._checks_agents import (
    check_grants_match_tools,
    check_memory,
    check_models,
    check_private_reach,
    check_secret_strength,
    check_task_scope,
)
from worker.operations._checks_config import (
    check_agents,
    check_grant_policy,
    check_mcp_config,
    check_prices,
    check_skills,
)
from worker.operations._checks_format import check_definition_format
from worker.operations._checks_network import probe_hub, probe_redis
from worker.operations._redis_option import redis_url_parser, use_redis_url
from worker.settings import Settings, load_settings

DEFAULT_TIMEOUT_S = 3.0


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
    agents = check_agents(report, config, agent_cache)
    check_skills(report, config)
    check_mcp_config(report, config, agents, network=network, timeout_s=timeout_s)
    check_definition_format(report, agents)
    check_grant_policy(report, config, agents)
    check_prices(report, config)
    _check_cli_installed(report, agents)
    _check_cli_sandbox(report, config, agents)
    check_models(report, config, agents, network=network, timeout_s=timeout_s)
    check_grants_match_tools(report, config, agents)
    check_memory(report, config, agents)
    check_task_scope(report, agents)
    check_private_reach(report, config, agents)
    check_secret_strength(report, config)
    if network:
        _check_hub(report, config, timeout_s)
    return report


def _check_cli_installed(report: CheckReport, agents: dict[str, AgentDefinition]) -> None:
    """Each CLI agent's CLI must be on this worker's PATH, or all its tasks fail."""
    from worker.executors import CliExecutor, executor_for

    for name, agent in sorted(agents.items()):
        try:
            executor = executor_for(agent.config.type)
        except ConfigurationError:
            continue  # the definition's check names an unknown type
        if not isinstance(executor, CliExecutor):
            continue
        if executor.executable_path() is None:
            report.error(
                f"agents/{name}/config.yaml",
                f"{executor.not_installed()} — agent {name}'s tasks fail until it is",
                agent=name,
            )
        else:
            report.checked.append(f"agent {name}: `{executor.binary}` is installed")


def _check_cli_sandbox(
    report: CheckReport, config: Settings, agents: dict[str, AgentDefinition]
) -> None:
    """CLI agents run only in the sandbox: each one fails while it is unavailable here.
    Off is the operator's choice, warned at every check and every worker start."""
    from worker.executors import sandbox_problem, sandbox_warning

    if config.cli_sandbox == "off":
        report.warning("CLI_SANDBOX", sandbox_warning())
        return
    cli_agents = sorted(name for name, agent in agents.items() if agent.config.type != "native")
    if not cli_agents:
        return  # nothing to confine: no probe
    problem = sandbox_problem(config)
    if problem is None:
        report.checked.append("the CLI sandbox works (bwrap)")
        return
    for name in cli_agents:
        report.error(
            "CLI_SANDBOX", f"{problem} — agent {name}'s tasks fail until it works", agent=name
        )


def _check_redis(report: CheckReport, config: Settings, timeout_s: float) -> None:
    client = None
    if config.redis_sentinels:
        from worker.redis_io import connect

        client = connect(config)  # the primary the sentinels name, as the worker finds it
    problem = probe_redis(config.redis_url, timeout_s=timeout_s, client=client)
    if problem is None:
        report.checked.append("Redis answers")
    else:
        report.error("REDIS_URL", problem)


def _check_hub(report: CheckReport, config: Settings, timeout_s: float) -> None:
    key = config.hub_api_key.get_secret_value() if config.hub_api_key else None
    problem = probe_hub(config.hub_url, key, timeout_s=timeout_s)
    if problem is None:
        report.checked.append("the Hub answers")
    elif problem.key_refused:  # every task would fail on it, then dead-letter its writes
        report.error("HUB_API_KEY", problem.message)
    else:
        report.warning("HUB_URL", problem.message)


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
    use_redis_url(args.redis_url)
    try:
        config = load_settings()
    except ConfigurationError as exc:
        report = CheckReport()
        variable, _, message = exc.message.removeprefix("invalid setting ").partition(": ")
        report.error(variable, message or exc.message)
    else:
        online = not args.offline
        # The report is this command's output: the worker's own warning lines about the
        # same definitions (agent_definition_warnings) would say each one twice.
        with only_at_least("error"):
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
    for line in report.reach:
        print(f"reach: {line}")
    summary = [f"{len(report.errors)} errors, {len(report.warnings)} warnings", *report.checked]
    print("check: " + "; ".join(summary))


def check_at_start(
    config: Settings, *, timeout_s: float = 2.0, agent_cache: Redis | None = None
) -> frozenset[str]:
    """What ``AgentWorker`` runs before taking work: log warnings and agent errors, and stop
    with one ``agent-worker: error: ...`` line per fleet-wide error (exit status 2).
    Returns the model providers the agents name.

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
    return frozenset(report.providers)
