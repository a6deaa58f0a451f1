"""The per-process cache of MCP servers' tool lists: fresh entries, expiry, invalidation."""

from __future__ import annotations

import mcp_types
import pytest

from worker.tools._tool_cache import ToolListCache


def tool(name: str) -> mcp_types.Tool:
    return mcp_types.Tool(name=name, input_schema={"type": "object"})


def test_a_stored_list_is_served_while_fresh() -> None:
    cache = ToolListCache()
    tools = (tool("echo"), tool("add"))
    assert cache.get("kit", ttl_s=60) is None
    cache.put("kit", tools)
    assert cache.get("kit", ttl_s=60) == tools
    assert cache.get("other", ttl_s=60) is None


def test_an_entry_older_than_the_ttl_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("worker.tools._tool_cache.time.monotonic", lambda: now[0])
    cache = ToolListCache()
    cache.put("kit", (tool("echo"),))
    now[0] += 59.9
    assert cache.get("kit", ttl_s=60) is not None
    now[0] += 0.1
    assert cache.get("kit", ttl_s=60) is None
    # A ttl of 0 turns the cache off.
    assert cache.get("kit", ttl_s=0) is None


def test_invalidate_and_clear_forget_lists() -> None:
    cache = ToolListCache()
    cache.put("kit", (tool("echo"),))
    cache.put("web", (tool("fetch"),))
    cache.invalidate("kit")
    cache.invalidate("never-stored")
    assert cache.get("kit", ttl_s=60) is None
    assert cache.get("web", ttl_s=60) is not None
    cache.clear()
    assert cache.get("web", ttl_s=60) is None
