"""CAN_EXECUTE_TOOL checks for tests (``tests.support.tool_checks:<name>``)."""

from __future__ import annotations

from typing import Any


def refuse_writes(tool_name: str, arguments: dict[str, Any]) -> str | None:
    """Refuses comments (and the unit tests' ``double``); the reason is what the model reads."""
    if tool_name.endswith(("create_comment", "double")):
        return f"policy: {tool_name} is read-only today"
    return None


async def allow_everything(tool_name: str, arguments: dict[str, Any]) -> bool:
    return True


def deny_by_false(tool_name: str, arguments: dict[str, Any]) -> bool:
    return False


def broken(tool_name: str, arguments: dict[str, Any]) -> str | None:
    raise RuntimeError("policy service unreachable")


def takes_nothing() -> None:
    return None


NOT_CALLABLE = "just a string"
