"""How a running task coordinates with the fleet through Redis, one module per concern.

    _leases       TaskLease (one worker runs a task at a time) and AgentSlots (how many
                  tasks of one agent run at once); who holds a lease, in which process
    _control      cancel and steer requests (``agent-worker cancel``/``steer``) a run reads
    _deadlines    the task deadline, fixed once so a retry does not get a fresh budget
    _checkpoints  the journal a retried task resumes from, and the tool-intent records

The names load on first use, so that the CLI gateway (which journals tool intents)
does not import redis before a task needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.coordination._checkpoints import (
        CHECKPOINT_TTL_S,
        IntentJournalingToolbox,
        RedisJournal,
        ToolIntent,
        journal_tool_intents,
    )
    from worker.coordination._control import (
        CONTROL_TTL_S,
        RedisControl,
        WorkerLost,
        cancel_task,
        clear_control,
        request_cancel,
        request_steer,
        steer_task,
    )
    from worker.coordination._deadlines import (
        DEADLINE_KEY_SLACK_S,
        TaskDeadline,
        fix_task_deadline,
        forget_task_deadline,
        read_task_deadline,
    )
    from worker.coordination._leases import (
        AgentSlots,
        Renewal,
        TaskLease,
        current_lease_holder,
        lease_holder,
        release_lease_of,
        run_of_holder,
    )
    from worker.coordination._runs import (
        LeaseLost,
        fence_revoked_run,
        in_process_run,
        revoke_in_process_run,
        run_is_revoked,
        running_in_process,
    )

_LEASES = "worker.coordination._leases"
_CONTROL = "worker.coordination._control"
_RUNS = "worker.coordination._runs"
_DEADLINES = "worker.coordination._deadlines"
_CHECKPOINTS = "worker.coordination._checkpoints"
_LAZY = {
    "AgentSlots": _LEASES,
    "Renewal": _LEASES,
    "TaskLease": _LEASES,
    "current_lease_holder": _LEASES,
    "in_process_run": _RUNS,
    "lease_holder": _LEASES,
    "release_lease_of": _LEASES,
    "revoke_in_process_run": _RUNS,
    "run_is_revoked": _RUNS,
    "run_of_holder": _LEASES,
    "running_in_process": _RUNS,
    "CONTROL_TTL_S": _CONTROL,
    "LeaseLost": _RUNS,
    "RedisControl": _CONTROL,
    "WorkerLost": _CONTROL,
    "cancel_task": _CONTROL,
    "clear_control": _CONTROL,
    "fence_revoked_run": _RUNS,
    "request_cancel": _CONTROL,
    "request_steer": _CONTROL,
    "steer_task": _CONTROL,
    "DEADLINE_KEY_SLACK_S": _DEADLINES,
    "TaskDeadline": _DEADLINES,
    "fix_task_deadline": _DEADLINES,
    "forget_task_deadline": _DEADLINES,
    "read_task_deadline": _DEADLINES,
    "CHECKPOINT_TTL_S": _CHECKPOINTS,
    "RedisJournal": _CHECKPOINTS,
    "ToolIntent": _CHECKPOINTS,
    "IntentJournalingToolbox": _CHECKPOINTS,
    "journal_tool_intents": _CHECKPOINTS,
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "CHECKPOINT_TTL_S",
    "CONTROL_TTL_S",
    "DEADLINE_KEY_SLACK_S",
    "AgentSlots",
    "IntentJournalingToolbox",
    "LeaseLost",
    "RedisControl",
    "RedisJournal",
    "Renewal",
    "TaskDeadline",
    "TaskLease",
    "ToolIntent",
    "WorkerLost",
    "cancel_task",
    "clear_control",
    "current_lease_holder",
    "fence_revoked_run",
    "fix_task_deadline",
    "forget_task_deadline",
    "in_process_run",
    "journal_tool_intents",
    "lease_holder",
    "read_task_deadline",
    "release_lease_of",
    "request_cancel",
    "request_steer",
    "revoke_in_process_run",
    "run_is_revoked",
    "run_of_holder",
    "running_in_process",
    "steer_task",
]
