"""Tools for the loop: the Toolbox protocol, in-process tools, and the grant-checked MCP layer.

``McpToolbox`` (and with it the MCP client) is imported on first use only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
from worker.tools._capability import (
    Capability,
    CapabilityRefused,
    mint_capability,
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
from worker.tools._local import LocalTool, LocalToolbox

if TYPE_CHECKING:
    from worker.tools._mcp import McpToolbox


def __getattr__(name: str) -> Any:
    if name == "McpToolbox":
        return importlib.import_module("worker.tools._mcp").McpToolbox
    raise AttributeError(f"module 'worker.tools' has no attribute {name!r}")


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
    "ToolResult",
    "Toolbox",
    "ToolboxWrapper",
    "check_grant_pattern",
    "grant_covers",
    "load_grant_policy",
    "load_mcp_config",
    "mint_capability",
    "verify_capability",
]
