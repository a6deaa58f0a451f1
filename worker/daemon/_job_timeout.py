"""rq's hard timeout for one run of a task, decided by the worker parent before the fork.

The job process enforces the task's deadline itself; rq's timeout is the
backstop behind it and must follow the same deadline: the tightest of the
agent's and the task's ``max_duration_s`` (never a task's looser value), and on
a re-run only what is left of the deadline the first run fixed, plus
``JOB_TIMEOUT_GRACE_S`` for the wind-down and the Hub writes after it.
"""

from __future__ import annotations

import math
import time

from redis import Redis
from redis.exceptions import RedisError

from worker.agents import AgentStore
from worker.coordination import read_task_deadline
from worker.enqueue import DEFAULT_MAX_DURATION_S
from worker.exceptions import WorkerError
from worker.task import Task


def run_timeout_s(
    redis: Redis,
    task: Task,
    *,
    grace_s: float,
    agents: AgentStore | None = None,
    now: float | None = None,
) -> int:
    """Seconds rq gives this run of ``task`` before it kills the job process."""
    duration_s = _tightest(task.constraints.max_duration_s, agent_max_duration_s(task, agents))
    try:
        deadline = read_task_deadline(redis, task.task_id)
    except RedisError:
        deadline = None
    if deadline is not None:
        remaining_s = deadline - (time.time() if now is None else now)
        duration_s = min(duration_s, max(0.0, remaining_s))
    return math.ceil(duration_s + grace_s)


def agent_max_duration_s(task: Task, agents: AgentStore | None) -> float | None:
    """The agent's ``limits.max_duration_s`` from its cached definition, else from a local
    ``AGENTS_DIR`` (which then caches it for the job); None when unknown.

    An HTTP source is never read here (it would hold up the worker): an agent not
    cached yet is then held to its deadline by the job process alone.
    """
    if agents is None:
        return None
    try:
        if agents.source.startswith(("http://", "https://")):
            cached = agents.cached(task.agent_id)
            return cached.config.limits.max_duration_s if cached else None
        return agents.load(task.agent_id).config.limits.max_duration_s
    except (WorkerError, RedisError, OSError):
        return None  # the job process reports what is wrong with the definition


def _tightest(task_s: float | None, agent_s: float | None) -> float:
    present = [value for value in (task_s, agent_s) if value is not None]
    return min(present) if present else float(DEFAULT_MAX_DURATION_S)
