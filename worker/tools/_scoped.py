"""The worker's side of a task's scope: a write outside it, or a private task's read
aimed where no trusted input points, is refused before it leaves.

``ScopedToolbox`` asks the task's ``TaskScope`` about every call: our hub server's
``create_comment`` and ``create_post`` by their target, our web server's ``fetch`` by its
URL (``Reach``: unbounded in a public task), a third-party tool by the argument rule the
operator stated for it in ``MCP_CONFIG`` (``scope``); in a private task a third-party tool
without a rule is withheld (not offered, refused if called) unless the operator lists it
in its server's ``private_ok``. A refused call
is not run: the model reads ``Error: out of scope: ...`` (trusted text only), the
handler hears of it (the worker logs and counts it and lists it in the report), and the
task goes on. Our servers check the same scope from the signed capability, so this layer
is the first of two, not the only one.

``ScopeCell`` holds the scope as the run knows it: nothing may be written until the
pipeline has read the task's context (its thread, or its feed) and set the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from worker.models import ToolSpec
from worker.tools._base import CallContext, Toolbox, ToolboxWrapper, ToolResult
from worker.tools._config import McpConfig
from worker.tools._scope import ScopeRefusal, TaskScope

# Our web server's tool whose one argument, ``url``, leaves the worker.
FETCH_TOOL = "fetch"

# Told of each write the scope held back.
ScopeRefusalHandler = Callable[[ScopeRefusal], None]


def ignore_refusal(refusal: ScopeRefusal) -> None:
    """The handler of a caller that only needs the model to be told."""


class ScopeCell:
    """The task's scope now: ``TaskScope.nothing()`` until the pipeline sets it."""

    def __init__(self, scope: TaskScope | None = None) -> None:
        self.scope = scope or TaskScope.nothing()


class ScopedToolbox(ToolboxWrapper):
    """A Toolbox whose writes stay within the task's scope (see the module docstring)."""

    def __init__(
        self,
        inner: Toolbox,
        scope: ScopeCell,
        *,
        hub_server: str,
        mcp_config: McpConfig | None,
        web_server: str = "web",
        on_refused: ScopeRefusalHandler = ignore_refusal,
    ) -> None:
        super().__init__(inner)
        self._scope = scope
        self._hub_server = hub_server
        self._web_server = web_server
        self._mcp_config = mcp_config
        self._on_refused = on_refused

    def offered(self) -> Sequence[ToolSpec]:
        """The inner tools, less those withheld from this task (only a private task's)."""
        return [spec for spec in self._inner.offered() if self._withheld(spec.name) is None]

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        refusal = self.refusal(name, arguments)
        if refusal is None:
            return await self._inner.call(name, arguments, ctx)
        self._on_refused(refusal)
        return ToolResult(content=f"Error: {refusal.message}", is_error=True, refused=True)

    def refusal(self, name: str, arguments: dict[str, Any]) -> ScopeRefusal | None:
        """Why the call ``name(arguments)`` is out of scope; None when it may run."""
        server, separator, tool = name.partition("__")
        if not separator:
            return None
        scope = self._scope.scope
        if server == self._hub_server:
            refusal = scope.hub_refusal(tool, arguments)
            return None if refusal is None else replace(refusal, tool=name)
        if server == self._web_server and tool == FETCH_TOOL:
            return scope.fetch_refusal(name, arguments.get("url"))
        entry = None if self._mcp_config is None else self._mcp_config.servers.get(server)
        rule = None if entry is None else entry.scope.get(tool)
        if rule is not None:
            return rule.refusal(name, arguments, scope)
        return self._withheld(name)

    def _withheld(self, name: str) -> ScopeRefusal | None:
        """A third-party tool with no argument rule, in a private task, unless the operator
        opened it to private tasks (``private_ok``); our own servers bound themselves."""
        server, _, tool = name.partition("__")
        entry = None if self._mcp_config is None else self._mcp_config.servers.get(server)
        if entry is None or entry.first_party or entry.open_to_private(tool):
            return None
        return self._scope.scope.withheld(name)
