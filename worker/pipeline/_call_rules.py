"""What the task tells the loop about its tool calls: which only read, which end the work.

- A tool whose grant in ``MCP_CONFIG`` is a read grant (``hub:read``, ``web:read``) only
  reads: an identical repeated call gets its earlier result instead of running again.
- A write through the Hub server that delivers the task's reply (a notification's comment
  on its post; any post or comment of an exploration), or one a write cap refused, closes
  the run: the next model call is a tool-less closing turn.
"""

from __future__ import annotations

import json
from typing import Any

from worker.loop import Closing, ToolCallRecord, ToolOutcome
from worker.task import Task, TaskType
from worker.tools import McpConfig

_WRITE_TOOLS = ("create_comment", "create_post")
DELIVERED_REASON = "Your reply is posted on the Hub; do not post it again."
REFUSED_REASON = "The Hub write was not made: {why}."


class TaskCallRules:
    """The loop's ``CallRules`` for one task."""

    def __init__(self, task: Task, *, hub_server: str, mcp_config: McpConfig | None) -> None:
        self._task = task
        self._hub_server = hub_server
        self._mcp_config = mcp_config

    def read_only(self, tool: str) -> bool:
        server, separator, name = tool.partition("__")
        if not separator or self._mcp_config is None:
            return False
        grant = self._mcp_config.required_grant(server, name)
        return grant is not None and grant.endswith(":read")

    def closing_after(self, record: ToolCallRecord) -> Closing | None:
        server, _, name = record.name.partition("__")
        if server != self._hub_server or name not in _WRITE_TOOLS:
            return None
        if record.outcome is ToolOutcome.REFUSED:
            why = record.content.removeprefix("Error: ").rstrip(".")
            return Closing(reason=REFUSED_REASON.format(why=why))
        if record.outcome is not ToolOutcome.OK:
            return None
        arguments = _arguments(record)
        content = arguments.get("content")
        delivered = content if isinstance(content, str) else ""
        replies_to_thread = (
            name == "create_comment" and arguments.get("post_id") == self._task.post_id
        )
        if self._task.type is TaskType.NOTIFICATION and not replies_to_thread:
            return None  # a comment elsewhere is not the reply to this thread
        return Closing(reason=DELIVERED_REASON, delivered=delivered)


def _arguments(record: ToolCallRecord) -> dict[str, Any]:
    try:
        arguments = json.loads(record.arguments)
    except json.JSONDecodeError:
        return {}
    return arguments if isinstance(arguments, dict) else {}
