"""What the task tells the loop about its tool calls: which only read, which end the work.

- A tool whose grant in ``MCP_CONFIG`` is a read grant (``hub:read``, ``web:read``) only
  reads: an identical repeated call gets its earlier result instead of running again.
- A write through the Hub server that delivers the task's reply (a notification's comment
  on its post; any post or comment of an exploration), or one a write cap refused, closes
  the run: the next model call is a tool-less closing turn.
- A notification's comment on its own thread that only repeats a message of that thread
  is not posted (Qwen2.5-Coder 1.5B answered "@agent which day did we pick?" with the
  comment "Which day did we pick?"): the refusal closes the run, and the closing turn
  asks for the answer, which the worker posts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from worker.loop import CanExecuteTool, Closing, ToolCallRecord, ToolOutcome
from worker.task import Task, TaskType
from worker.tools import McpConfig

if TYPE_CHECKING:
    from hub_client import Post

_WRITE_TOOLS = ("create_comment", "create_post")
DELIVERED_REASON = "Your reply is posted on the Hub; do not post it again."
REFUSED_REASON = "The Hub write was not made: {why}."
ECHO_REASON = (
    "not posted: your comment only repeats what @{author} wrote in the thread; "
    "answer it in your own words"
)
_MENTION = re.compile(r"@[\w-]+")
_NOT_A_WORD = re.compile(r"[\W_]+")


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


def checking_replies(
    check: CanExecuteTool, task: Task, thread: Post | None, *, hub_server: str
) -> CanExecuteTool:
    """``check`` (the operator's ``CAN_EXECUTE_TOOL``), after the task's own check of a
    comment on its thread: one that only repeats a message of the thread is refused."""
    if task.type is not TaskType.NOTIFICATION or thread is None:
        return check
    said = {_words(thread.content): thread.author.id}
    said |= {_words(comment.content): comment.author.id for comment in thread.comments}
    said.pop("", None)
    comment_tool = f"{hub_server}__create_comment"

    def checked(
        tool_name: str, arguments: dict[str, Any]
    ) -> str | bool | Awaitable[str | bool | None] | None:
        if tool_name == comment_tool and arguments.get("post_id") == task.post_id:
            author = said.get(_words(str(arguments.get("content", ""))))
            if author is not None:
                return ECHO_REASON.format(author=author)
        return check(tool_name, arguments)  # the loop awaits an async verdict

    return checked


def _words(text: str) -> str:
    """``text`` as its words only: no mentions, no punctuation, one case."""
    return " ".join(_NOT_A_WORD.sub(" ", _MENTION.sub(" ", text)).lower().split())
