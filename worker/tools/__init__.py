"""Tools for the loop: the Toolbox protocol, in-process tools, and the grant-checked MCP layer.

The Toolbox protocol and in-process tools load with the package; grants and
capabilities (PyJWT, YAML, pydantic), the MCP config and ``McpToolbox`` (the MCP
client) load on first use, so that ``worker.loop`` stays light. So do the operator's
``CAN_EXECUTE_TOOL`` hook loader (it lives in ``worker._hooks``, below the settings that
check it) and the wrappers that give tool calls idempotency keys across crashes and
re-runs (``_idempotency``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# First: it notes which process loaded the tools (the worker parent, before any fork).
import worker._spawn  # noqa: F401
from worker._lazy import lazy_getattr
from worker.tools._base import (
    CallContext,
    Granted,
    MissingGrant,
    NotAllowed,
    Resolution,
    Toolbox,
    ToolboxWrapper,
    ToolResult,
)
from worker.tools._local import LocalTool, LocalToolbox

if TYPE_CHECKING:
    from worker._hooks import load_can_execute_tool, load_hook
    from worker.tools._capability import (
        Capability,
        CapabilityRefused,
        check_key,
        mint_capability,
        read_capability,
        verify_capability,
    )
    from worker.tools._config import McpConfig, McpServerConfig, load_mcp_config
    from worker.tools._grants import (
        ANY_COMMUNITY,
        EffectiveGrants,
        GrantPolicy,
        cached_grant_policy,
        check_grant_pattern,
        grant_covers,
        load_grant_policy,
    )
    from worker.tools._idempotency import (
        ContentKeyedToolbox,
        KeyedCallContext,
        arguments_digest,
        content_key,
    )
    from worker.tools._mcp import CapabilitySource, McpToolbox, fixed_capability, no_capability
    from worker.tools._pool import StdioPool, close_stdio_pool, stdio_pool
    from worker.tools._reach import Reach, origin_of, urls_in
    from worker.tools._scope import (
        PUBLIC,
        ArgumentRule,
        ScopeReason,
        ScopeRefusal,
        TaskScope,
        dm_audience,
    )
    from worker.tools._scoped import ScopeCell, ScopedToolbox, ScopeRefusalHandler

_LAZY = {
    "Capability": "worker.tools._capability",
    "CapabilityRefused": "worker.tools._capability",
    "check_key": "worker.tools._capability",
    "mint_capability": "worker.tools._capability",
    "read_capability": "worker.tools._capability",
    "verify_capability": "worker.tools._capability",
    "McpConfig": "worker.tools._config",
    "McpServerConfig": "worker.tools._config",
    "load_mcp_config": "worker.tools._config",
    "EffectiveGrants": "worker.tools._grants",
    "ANY_COMMUNITY": "worker.tools._grants",
    "GrantPolicy": "worker.tools._grants",
    "check_grant_pattern": "worker.tools._grants",
    "grant_covers": "worker.tools._grants",
    "load_grant_policy": "worker.tools._grants",
    "cached_grant_policy": "worker.tools._grants",
    "load_can_execute_tool": "worker._hooks",
    "load_hook": "worker._hooks",
    "ContentKeyedToolbox": "worker.tools._idempotency",
    "KeyedCallContext": "worker.tools._idempotency",
    "content_key": "worker.tools._idempotency",
    "arguments_digest": "worker.tools._idempotency",
    "CapabilitySource": "worker.tools._mcp",
    "McpToolbox": "worker.tools._mcp",
    "fixed_capability": "worker.tools._mcp",
    "no_capability": "worker.tools._mcp",
    "StdioPool": "worker.tools._pool",
    "close_stdio_pool": "worker.tools._pool",
    "stdio_pool": "worker.tools._pool",
    "Reach": "worker.tools._reach",
    "origin_of": "worker.tools._reach",
    "urls_in": "worker.tools._reach",
    "PUBLIC": "worker.tools._scope",
    "ArgumentRule": "worker.tools._scope",
    "ScopeReason": "worker.tools._scope",
    "ScopeRefusal": "worker.tools._scope",
    "TaskScope": "worker.tools._scope",
    "dm_audience": "worker.tools._scope",
    "ScopeCell": "worker.tools._scoped",
    "ScopedToolbox": "worker.tools._scoped",
    "ScopeRefusalHandler": "worker.tools._scoped",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "ANY_COMMUNITY",
    "PUBLIC",
    "ArgumentRule",
    "CallContext",
    "Capability",
    "CapabilityRefused",
    "CapabilitySource",
    "ContentKeyedToolbox",
    "EffectiveGrants",
    "GrantPolicy",
    "Granted",
    "KeyedCallContext",
    "LocalTool",
    "LocalToolbox",
    "McpConfig",
    "McpServerConfig",
    "McpToolbox",
    "MissingGrant",
    "NotAllowed",
    "Reach",
    "Resolution",
    "ScopeCell",
    "ScopeReason",
    "ScopeRefusal",
    "ScopeRefusalHandler",
    "ScopedToolbox",
    "StdioPool",
    "TaskScope",
    "ToolResult",
    "Toolbox",
    "ToolboxWrapper",
    "arguments_digest",
    "cached_grant_policy",
    "check_grant_pattern",
    "check_key",
    "close_stdio_pool",
    "content_key",
    "dm_audience",
    "fixed_capability",
    "grant_covers",
    "load_can_execute_tool",
    "load_grant_policy",
    "load_hook",
    "load_mcp_config",
    "mint_capability",
    "no_capability",
    "origin_of",
    "read_capability",
    "stdio_pool",
    "urls_in",
    "verify_capability",
]
