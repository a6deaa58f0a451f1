"""Operator commands: ``agent-worker`` and the library functions behind each subcommand.

    _cli            ``agent-worker`` (also ``python -m worker.operations``): one subcommand each
    _redis_option   ``--redis-url``, taken by every command that uses Redis
    _status         ``status``: the fleet read from Redis (FleetStatus, its JSON schema)
    _status_view    ``status``: its tables, and the command
    _checks         ``check``: run_checks, and check_at_start for AgentWorker
    _checks_config  ``check``: AGENTS_DIR, skills, MCP_CONFIG, GRANT_POLICY, PRICES_FILE
    _checks_network ``check``: does Redis, the Hub, each HTTP MCP server answer?
    _checks_format  ``check``: Botburrow-format warnings, each agent's effective values
    _check_report   ``check``: what it found
    _schedule       ``schedule``: the scheduler process (lead or wait, one round per interval)
    _scheduler      ``schedule``: one round over the Hub's stale agents
    _agent_state    ``schedule``: what it remembers of each agent, how its last run went
    _leader_lock    ``schedule``: one leader per fleet
    _repairs        ``requeue`` and ``reload-agents``
    _dead_letters   ``dead-letters list|replay|drop``
    _reports        ``report``: a task's AgentReport
    _session        settings, Redis and a redactor, as each command that uses Redis starts
    _job_lookup     a task's rq job by the id an operator typed

Every subcommand is a thin adapter over a function here, so whatever an operator can do
with ``agent-worker`` is also callable from Python. The names load on first use: the
worker imports ``check_at_start`` without paying for the scheduler or ``status``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.operations._checks import check_at_start as check_at_start
    from worker.operations._cli import EXTENSIONS as EXTENSIONS
    from worker.operations._cli import command_parser as command_parser
    from worker.operations._cli import main as main
    from worker.operations._redis_option import redis_url_parser as redis_url_parser
    from worker.operations._redis_option import use_redis_url as use_redis_url


__getattr__ = lazy_getattr(__name__)
