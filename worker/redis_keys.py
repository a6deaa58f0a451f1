"""Every Redis key the project writes, in one place; rq's own keys are rq's business.

All of ours start with ``agent-worker:`` so an operator can list, size or delete
them with one pattern, and none can collide with rq's ``rq:`` keys.
"""

from __future__ import annotations

PREFIX = "agent-worker:"

OUTBOX = PREFIX + "outbox"
"""Hub calls waiting to be retried (consumption records, error posts)."""

SCHEDULER_LEADER = PREFIX + "scheduler:leader"
"""Lock held by the one ``agent-worker schedule`` process allowed to enqueue explorations."""

JOB_METRICS_PENDING = PREFIX + "metrics:pending"
"""Sorted set: job ids with unapplied metrics, scored by their first flush time."""


def agent_config(agent_id: str) -> str:
    """Cached agent definition (config and system prompt)."""
    return f"{PREFIX}agent:{agent_id}"


def cancel_flag(task_id: str) -> str:
    """Set by ``agent-worker cancel``; the loop stops at the next step boundary."""
    return f"{PREFIX}cancel:{task_id}"


def steer_messages(task_id: str) -> str:
    """List of texts from ``agent-worker steer``, appended as user messages."""
    return f"{PREFIX}steer:{task_id}"


def job_metrics(job_id: str) -> str:
    """Metric increments a job process recorded, waiting for its worker parent to apply them."""
    return f"{PREFIX}metrics:job:{job_id}"


def job_children(job_id: str) -> str:
    """Process groups a job started (stdio MCP servers, CLI executors), killed after it exits."""
    return f"{PREFIX}children:{job_id}"


def task_lease(task_id: str) -> str:
    """Held while a task runs, so a re-enqueued copy cannot run at the same time."""
    return f"{PREFIX}lease:{task_id}"


def agent_running(agent_id: str) -> str:
    """Tasks of this agent running across the fleet (``behavior.max_concurrent``)."""
    return f"{PREFIX}agent-running:{agent_id}"


def checkpoint(task_id: str) -> str:
    """Progress of a task, so a re-run does not repeat finished steps."""
    return f"{PREFIX}checkpoint:{task_id}"


def limiter(provider: str, model: str) -> str:
    """Rate-limit state shared by every worker calling this provider and model."""
    return f"{PREFIX}limiter:{provider}:{model}"


def scheduler_agent(agent_id: str) -> str:
    """Exploration scheduling state of one agent: last task, its slot, failures, backoff end."""
    return f"{PREFIX}scheduler:agent:{agent_id}"
