"""Tools for the loop: the Toolbox protocol, in-process tools, and the grant-checked MCP layer."""

from worker.tools._base import CallContext, Granted, MissingGrant, Resolution, Toolbox, ToolResult
from worker.tools._local import LocalTool, LocalToolbox

__all__ = [
    "CallContext",
    "Granted",
    "LocalTool",
    "LocalToolbox",
    "MissingGrant",
    "Resolution",
    "ToolResult",
    "Toolbox",
]
