"""Every Redis key the project writes, in one place; rq's own keys are rq's business.

All of ours start with ``agent-worker:`` so an operator can list, size or delete
them with one pattern, and none can collide with rq's ``rq:`` keys.
"""

from __future__ import annotations

PREFIX = "agent-worker:"

OUTBOX = PREFIX + "outbox"
"""Hub calls waiting to be retried (consumption records, error posts)."""

OUTBOX_DEAD_LETTERS = PREFIX + "outbox:dead-letters"
"""Hash: Hub writes the Hub refused or that ran out of attempts, by idempotency key."""

OUTBOX_DEAD_LETTER_ORDER = PREFIX + "outbox:dead-letters:order"
"""Sorted set: the dead letters' keys scored by when they died (newest last)."""

SCHEDULER_LEADER = PREFIX + "scheduler:leader"
"""Lock held by the one ``agent-worker schedule`` process allowed to enqueue explorations."""

JOB_METRICS_PENDING = PREFIX + "metrics:pending"
"""Sorted set: job ids with unapplied metrics, scored by their first flush time."""

JOB_SPANS_PENDING = PREFIX + "spans:pending"
"""Sorted set: job ids with spans their worker has not exported yet, scored by the first write."""


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


def job_children(job_id: str, execution_id: str | None = None) -> str:
    """Process groups one run of a job started (stdio MCP servers, CLI executors), killed
    after that run ends; a run is rq's execution (none: the job called outside rq)."""
    base = f"{PREFIX}children:{job_id}"
    return base if execution_id is None else f"{base}:{execution_id}"


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


def daily_writes(agent_id: str, kind: str, day: str) -> str:
    """Posts or comments (``kind``) an agent made on a UTC ``day`` (YYYY-MM-DD), fleet-wide."""
    return f"{PREFIX}writes:{agent_id}:{kind}:{day}"


def task_post_writes(task_id: str) -> str:
    """Hash: comments a task made per post id (``MAX_WRITES_PER_POST``)."""
    return f"{PREFIX}writes:task:{task_id}"


def task_write_reservations(task_id: str) -> str:
    """Set: the tokens of a task's write reservations, so a retried reservation (or refund)
    counts once."""
    return f"{PREFIX}write-reservations:{task_id}"


def thread_writes(agent_id: str, post_id: str) -> str:
    """Comments an agent made on one thread (the post ``post_id`` and its comments), fleet-wide
    (``max_responses_per_thread``)."""
    return f"{PREFIX}thread-writes:{agent_id}:{post_id}"


def last_write(agent_id: str) -> str:
    """Set while an agent must wait before its next write (``min_interval_seconds``)."""
    return f"{PREFIX}writes:last:{agent_id}"


def scheduler_agent(agent_id: str) -> str:
    """Exploration scheduling state of one agent: last task, its slot, failures, backoff end."""
    return f"{PREFIX}scheduler:agent:{agent_id}"


def job_spans(job_id: str) -> str:
    """Spans a forked job process wrote (JSON records), waiting for its worker to export them."""
    return f"{PREFIX}spans:job:{job_id}"


def trace_delivery(trace_id: str, span_id: str) -> str:
    """Set by the first run that continues a producer's trace; later runs link to it."""
    return f"{PREFIX}trace-delivery:{trace_id}:{span_id}"


def task_deadline(task_id: str) -> str:
    """The task's absolute deadline (epoch seconds), fixed at its first start; re-runs keep it."""
    return f"{PREFIX}deadline:{task_id}"


MEMORY_BYTES = PREFIX + "memory:bytes"
"""Hash: bytes each agent's memory holds (records and vectors), by agent id."""


def memory_records(agent_id: str) -> str:
    """Hash: an agent's memories (JSON records) by memory id."""
    return f"{PREFIX}memory:{agent_id}:records"


def memory_order(agent_id: str) -> str:
    """Sorted set: an agent's memory ids scored by when they were written (oldest first)."""
    return f"{PREFIX}memory:{agent_id}:order"


def memory_vectors(agent_id: str) -> str:
    """Hash: embeddings of an agent's memories (float32, little-endian) by memory id."""
    return f"{PREFIX}memory:{agent_id}:vectors"
