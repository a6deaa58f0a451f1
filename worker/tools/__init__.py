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
from worker.tools._base import CallContext as CallContext
from worker.tools._base import Granted as Granted
from worker.tools._base import MissingGrant as MissingGrant
from worker.tools._base import NotAllowed as NotAllowed
from worker.tools._base import Toolbox as Toolbox
from worker.tools._base import ToolboxWrapper as ToolboxWrapper
from worker.tools._base import ToolResult as ToolResult
from worker.tools._local import LocalToolbox as LocalToolbox

if TYPE_CHECKING:
    from worker._hooks import load_can_execute_tool as load_can_execute_tool
    from worker.tools._capability import Capability as Capability
    from worker.tools._capability import CapabilityRefused as CapabilityRefused
    from worker.tools._capability import check_key as check_key
    from worker.tools._capability import mint_capability as mint_capability
    from worker.tools._capability import read_capability as read_capability
    from worker.tools._capability import verify_capability as verify_capability
    from worker.tools._config import McpConfig as McpConfig
    from worker.tools._config import load_mcp_config as load_mcp_config
    from worker.tools._grants import ANY_COMMUNITY as ANY_COMMUNITY
    from worker.tools._grants import EffectiveGrants as EffectiveGrants
    from worker.tools._grants import GrantPolicy as GrantPolicy
    from worker.tools._grants import cached_grant_policy as cached_grant_policy
    from worker.tools._grants import grant_covers as grant_covers
    from worker.tools._grants import load_grant_policy as load_grant_policy
    from worker.tools._idempotency import ContentKeyedToolbox as ContentKeyedToolbox
    from worker.tools._idempotency import KeyedCallContext as KeyedCallContext
    from worker.tools._idempotency import arguments_digest as arguments_digest
    from worker.tools._mcp import CapabilitySource as CapabilitySource
    from worker.tools._mcp import McpToolbox as McpToolbox
    from worker.tools._mcp import fixed_capability as fixed_capability
    from worker.tools._mcp import no_capability as no_capability
    from worker.tools._pool import close_stdio_pool as close_stdio_pool
    from worker.tools._reach import Reach as Reach
    from worker.tools._reach import origin_of as origin_of
    from worker.tools._reach import urls_in as urls_in
    from worker.tools._scope import PUBLIC as PUBLIC
    from worker.tools._scope import ScopeReason as ScopeReason
    from worker.tools._scope import ScopeRefusal as ScopeRefusal
    from worker.tools._scope import TaskScope as TaskScope
    from worker.tools._scope import dm_audience as dm_audience
    from worker.tools._scoped import ScopeCell as ScopeCell
    from worker.tools._scoped import ScopedToolbox as ScopedToolbox
    from worker.tools._scoped import ScopeRefusalHandler as ScopeRefusalHandler


__getattr__ = lazy_getattr(__name__)
