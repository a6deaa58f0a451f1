"""How a running task coordinates with the fleet through Redis, one module per concern.

_leases       TaskLease (one worker runs a task at a time) and AgentSlots (how many
              tasks of one agent run at once); who holds a lease, in which process
_control      cancel and steer requests (``agent-worker cancel``/``steer``) a run reads
_deadlines    the task deadline, fixed once so a retry does not get a fresh budget
_checkpoints  the journal a retried task resumes from, and the tool-intent records
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.coordination._checkpoints import RedisJournal as RedisJournal
    from worker.coordination._checkpoints import journal_tool_intents as journal_tool_intents
    from worker.coordination._control import RedisControl as RedisControl
    from worker.coordination._control import WorkerLost as WorkerLost
    from worker.coordination._control import cancel_task as cancel_task
    from worker.coordination._control import clear_control as clear_control
    from worker.coordination._control import request_cancel as request_cancel
    from worker.coordination._control import steer_task as steer_task
    from worker.coordination._deadlines import TaskDeadline as TaskDeadline
    from worker.coordination._deadlines import fix_task_deadline as fix_task_deadline
    from worker.coordination._deadlines import forget_task_deadline as forget_task_deadline
    from worker.coordination._deadlines import read_task_deadline as read_task_deadline
    from worker.coordination._leases import AgentSlots as AgentSlots
    from worker.coordination._leases import TaskLease as TaskLease
    from worker.coordination._leases import current_lease_holder as current_lease_holder
    from worker.coordination._leases import release_lease_of as release_lease_of
    from worker.coordination._runs import LeaseLost as LeaseLost
    from worker.coordination._runs import fence_revoked_run as fence_revoked_run
    from worker.coordination._runs import in_process_run as in_process_run
    from worker.coordination._runs import revoke_in_process_run as revoke_in_process_run
    from worker.coordination._runs import run_is_revoked as run_is_revoked
    from worker.coordination._runs import running_in_process as running_in_process

__getattr__ = lazy_getattr(__name__)
