"""In-process tools: Python callables behind the Toolbox protocol (tests, demo, benchmarks)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.exceptions import ToolFailed
from worker.models import ToolSpec
from worker.tools._base import CallContext, Granted, MissingGrant, Resolution, ToolResult

ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]


@dataclass(slots=True, kw_only=True)
class LocalTool:
    name: str
    function: ToolFunction
    description: str = ""
    input_schema: Mapping[str, Any] | None = None
    required_grant: str | None = None
    # When set, the function also receives the CallContext as ``ctx``.
    wants_context: bool = False


class LocalToolbox:
    """Offers local tools whose grant is in ``grants`` (None = every tool granted); with
    ``strict``, a call to one outside them ends the task."""

    def __init__(
        self, tools: Sequence[LocalTool], *, grants: set[str] | None = None, strict: bool = False
    ) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._grants = grants
        self._strict = strict
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._specs = {
            tool.name: ToolSpec(
                name=tool.name,
                description=tool.description or (inspect.getdoc(tool.function) or ""),
                input_schema=dict(tool.input_schema or {"type": "object", "properties": {}}),
            )
            for tool in tools
        }

    def _granted(self, tool: LocalTool) -> bool:
        return (
            self._grants is None
            or tool.required_grant is None
            or (tool.required_grant in self._grants)
        )

    def offered(self) -> Sequence[ToolSpec]:
        return [self._specs[name] for name, tool in self._tools.items() if self._granted(tool)]

    def resolve(self, name: str) -> Resolution:
        tool = self._tools.get(name)
        if tool is None:
            return None
        if not self._granted(tool):
            return MissingGrant(
                name=name, required_grant=tool.required_grant or "", strict=self._strict
            )
        return Granted(spec=self._specs[name], server="local")

    async def call(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        tool = self._tools[name]
        self.calls.append((name, arguments))
        kwargs = dict(arguments)
        if tool.wants_context:
            kwargs["ctx"] = ctx
        try:
            value = tool.function(**kwargs)
            if inspect.isawaitable(value):
                value = await value
        except ToolFailed:
            raise
        except Exception as exc:
            raise ToolFailed(f"tool {name!r} failed: {exc}") from exc
        if isinstance(value, ToolResult):
            return value
        return ToolResult(content=value if isinstance(value, str) else repr(value))
