"""Tools for the loop: the Toolbox protocol, in-process tools, and the grant-checked MCP layer.

The Toolbox protocol and in-process tools load with the package; grants and
capabilities (PyJWT, YAML, pydantic), the MCP config and ``McpToolbox`` (the MCP
client) load on first use, so that ``worker.loop`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

# First: it notes which process loaded the tools (the worker parent, before any fork).
from worker.tools import _forks  # noqa: F401
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
        EffectiveGrants,
        GrantPolicy,
        check_grant_pattern,
        grant_covers,
        load_grant_policy,
    )
    from worker.tools._mcp import McpToolbox
    from worker.tools._pool import StdioPool, close_stdio_pool, stdio_pool

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
    "GrantPolicy": "worker.tools._grants",
    "check_grant_pattern": "worker.tools._grants",
    "grant_covers": "worker.tools._grants",
    "load_grant_policy": "worker.tools._grants",
    "McpToolbox": "worker.tools._mcp",
    "StdioPool": "worker.tools._pool",
    "close_stdio_pool": "worker.tools._pool",
    "stdio_pool": "worker.tools._pool",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "CallContext",
    "Capability",
    "CapabilityRefused",
    "EffectiveGrants",
    "GrantPolicy",
    "Granted",
    "LocalTool",
    "LocalToolbox",
    "McpConfig",
    "McpServerConfig",
    "McpToolbox",
    "MissingGrant",
    "NotAllowed",
    "Resolution",
    "StdioPool",
    "ToolResult",
    "Toolbox",
    "ToolboxWrapper",
    "check_grant_pattern",
    "check_key",
    "close_stdio_pool",
    "grant_covers",
    "load_grant_policy",
    "load_mcp_config",
    "mint_capability",
    "read_capability",
    "stdio_pool",
    "verify_capability",
]
