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
    from worker.operations._agent_state import AgentState, LastRun, agent_state_key, last_run_of
    from worker.operations._check_report import CheckReport, Problem, Severity
    from worker.operations._checks import check_at_start, run_checks
    from worker.operations._cli import EXTENSIONS, command_parser, main
    from worker.operations._dead_letters import (
        DeadLetter,
        dead_letter_count,
        drop_dead_letters,
        list_dead_letters,
        newest_dead_letter,
        replay_dead_letter,
    )
    from worker.operations._leader_lock import LeaderLock
    from worker.operations._repairs import (
        FailedTask,
        RequeueOutcome,
        failed_task_ids,
        find_failed_task,
        requeue_failed,
    )
    from worker.operations._reports import StoredReport, find_report, render_report
    from worker.operations._schedule import run_forever, run_once
    from worker.operations._scheduler import (
        Decision,
        HubStaleAgents,
        RoundResult,
        ScheduleConfig,
        Scheduler,
        exploration_task_id,
    )
    from worker.operations._status import FleetStatus, collect_status
    from worker.operations._status_view import render_table

_LAZY = {
    "AgentState": "worker.operations._agent_state",
    "CheckReport": "worker.operations._check_report",
    "DeadLetter": "worker.operations._dead_letters",
    "Decision": "worker.operations._scheduler",
    "FailedTask": "worker.operations._repairs",
    "FleetStatus": "worker.operations._status",
    "HubStaleAgents": "worker.operations._scheduler",
    "LastRun": "worker.operations._agent_state",
    "LeaderLock": "worker.operations._leader_lock",
    "Problem": "worker.operations._check_report",
    "RequeueOutcome": "worker.operations._repairs",
    "RoundResult": "worker.operations._scheduler",
    "ScheduleConfig": "worker.operations._scheduler",
    "Scheduler": "worker.operations._scheduler",
    "Severity": "worker.operations._check_report",
    "StoredReport": "worker.operations._reports",
    "agent_state_key": "worker.operations._agent_state",
    "check_at_start": "worker.operations._checks",
    "collect_status": "worker.operations._status",
    "dead_letter_count": "worker.operations._dead_letters",
    "drop_dead_letters": "worker.operations._dead_letters",
    "exploration_task_id": "worker.operations._scheduler",
    "failed_task_ids": "worker.operations._repairs",
    "find_failed_task": "worker.operations._repairs",
    "find_report": "worker.operations._reports",
    "last_run_of": "worker.operations._agent_state",
    "list_dead_letters": "worker.operations._dead_letters",
    "main": "worker.operations._cli",
    "EXTENSIONS": "worker.operations._cli",
    "command_parser": "worker.operations._cli",
    "newest_dead_letter": "worker.operations._dead_letters",
    "redis_url_parser": "worker.operations._redis_option",
    "render_report": "worker.operations._reports",
    "render_table": "worker.operations._status_view",
    "replay_dead_letter": "worker.operations._dead_letters",
    "requeue_failed": "worker.operations._repairs",
    "run_checks": "worker.operations._checks",
    "run_forever": "worker.operations._schedule",
    "run_once": "worker.operations._schedule",
    "use_redis_url": "worker.operations._redis_option",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "EXTENSIONS",
    "AgentState",
    "CheckReport",
    "DeadLetter",
    "Decision",
    "FailedTask",
    "FleetStatus",
    "HubStaleAgents",
    "LastRun",
    "LeaderLock",
    "Problem",
    "RequeueOutcome",
    "RoundResult",
    "ScheduleConfig",
    "Scheduler",
    "Severity",
    "StoredReport",
    "agent_state_key",
    "check_at_start",
    "collect_status",
    "command_parser",
    "dead_letter_count",
    "drop_dead_letters",
    "exploration_task_id",
    "failed_task_ids",
    "find_failed_task",
    "find_report",
    "last_run_of",
    "list_dead_letters",
    "main",
    "newest_dead_letter",
    "redis_url_parser",
    "render_report",
    "render_table",
    "replay_dead_letter",
    "requeue_failed",
    "run_checks",
    "run_forever",
    "run_once",
    "use_redis_url",
]
