"""The tools each MCP server listed, kept per process so that a task need not ask again.

A task's toolbox asks a server for its tools only when this cache has no fresh list for
that server. The cache holds the server's whole list, never one filtered for an agent:
grants, the task's ``allowed_tools`` and the config's map are applied per task after it.

An entry is keyed by the server's identity (``McpServerConfig.identity``: its name and
every field of its entry, so an edited MCP_CONFIG never meets a stale list) and lives at
most ``ttl_s``. It is dropped sooner when the server restarts (a pooled stdio server) or
when a call says a listed tool is unknown. Tasks in several threads of one process share
it, hence the lock.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import mcp_types

# Long enough to spare most tasks the listing, short enough that a server deployed with
# new tools is seen within minutes.
DEFAULT_TOOL_LIST_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class _Entry:
    tools: tuple[mcp_types.Tool, ...]
    stored_at: float


class ToolListCache:
    """Server tool lists by server identity, each for at most ``ttl_s`` seconds."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def renew_lock(self) -> None:
        """In a forked child: another thread may have held the lock at the fork."""
        self._lock = threading.Lock()

    def get(self, identity: str, *, ttl_s: float) -> tuple[mcp_types.Tool, ...] | None:
        """The list stored for ``identity`` within the last ``ttl_s`` seconds, else None."""
        with self._lock:
            entry = self._entries.get(identity)
        if entry is None or time.monotonic() - entry.stored_at >= ttl_s:
            return None
        return entry.tools

    def put(self, identity: str, tools: tuple[mcp_types.Tool, ...]) -> None:
        with self._lock:
            self._entries[identity] = _Entry(tools=tools, stored_at=time.monotonic())

    def invalidate(self, identity: str) -> None:
        """Forget a server's list: it restarted, or it no longer knows a tool it listed."""
        with self._lock:
            self._entries.pop(identity, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# One per process: every toolbox of every task in this process reads and fills it.
tool_lists = ToolListCache()
os.register_at_fork(after_in_child=tool_lists.renew_lock)
