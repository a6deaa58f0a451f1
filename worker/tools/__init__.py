"""Tools for the loop: the Toolbox protocol, in-process tools, and the grant-checked MCP layer."""

from worker.tools._base import CallContext, Granted, MissingGrant, Resolution, Toolbox, ToolResult
from worker.tools._config import McpConfig, McpServerConfig, load_mcp_config
from worker.tools._grants import (
    EffectiveGrants,
    GrantPolicy,
    check_grant_pattern,
    grant_covers,
    load_grant_policy,
)
from worker.tools._local import LocalTool, LocalToolbox
from worker.tools._mcp import McpToolbox

__all__ = [
    "CallContext",
    "EffectiveGrants",
    "GrantPolicy",
    "Granted",
    "LocalTool",
    "LocalToolbox",
    "McpConfig",
    "McpServerConfig",
    "McpToolbox",
    "MissingGrant",
    "Resolution",
    "ToolResult",
    "Toolbox",
    "check_grant_pattern",
    "grant_covers",
    "load_grant_policy",
    "load_mcp_config",
]
