"""Running one tool call: resolve, check the grant, parse and validate arguments, call."""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker._hooks import allow_every_tool
from worker.exceptions import AutonomyViolation, ToolFailed
from worker.logs import log_event
from worker.loop._events import EventBus, GrantDenied, ToolCalled
from worker.loop._output import truncate
from worker.loop._schemas import SchemaCheck, schema_check
from worker.loop._state import StepRecord, ToolCallRecord, ToolOutcome
from worker.loop._timeout import call_timeout
from worker.models import ToolCall, ToolSpec
from worker.tools import CallContext, Granted, MissingGrant, NotAllowed, Toolbox
from worker.tracing import traced_tool_call

# Decides, per call and before execution, whether it may run: None (or True) allows; a
# string refuses, and is what the model reads; anything else refuses. May be async.
CanExecuteTool = Callable[[str, dict[str, Any]], "str | bool | Awaitable[str | bool | None] | None"]

_TIMEOUT_BACKSTOP_S = 0.5

DONE_TOOL = ToolSpec(
    name="task_complete",
    description="Call this once the task is done, with your final answer for the user.",
    input_schema={
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "Your final answer."}},
        "required": ["answer"],
    },
)


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """How a call ended and what the model reads; ``server`` is "" when none was reached."""

    outcome: ToolOutcome
    content: str
    server: str = ""


class ToolDispatcher:
    """Runs the model's tool calls: resolve, check the grant, parse and validate, call.

    Used by the loop, and by the MCP gateway for the CLI executors, so both apply the
    same checks and report the same outcomes.
    """

    def __init__(
        self,
        toolbox: Toolbox,
        *,
        task_id: str,
        agent_id: str,
        events: EventBus,
        max_output_chars: int,
        can_execute_tool: CanExecuteTool = allow_every_tool,
    ) -> None:
        self._toolbox = toolbox
        self._task_id = task_id
        self._agent_id = agent_id
        self._events = events
        self._max_chars = max_output_chars
        self._can_execute = can_execute_tool
        # Per tool name: the process's checks of its schema (prepared once per process).
        self._checks: dict[str, SchemaCheck] = {}

    async def run(self, step: int, index: int, call: ToolCall, timeout_s: float) -> ToolCallRecord:
        """Run one call the model made, in one ``execute_tool {tool}`` span; every way it
        can end is a record the model reads."""
        return await traced_tool_call(call, lambda: self._run(step, index, call, timeout_s))

    async def _run(self, step: int, index: int, call: ToolCall, timeout_s: float) -> ToolCallRecord:
        started = time.perf_counter()
        result = await self._execute(step, index, call, timeout_s)
        duration = time.perf_counter() - started
        self._events.emit(
            ToolCalled(
                step=step,
                tool=call.name,
                server=result.server,
                outcome=result.outcome,
                duration_s=duration,
                known=result.outcome is not ToolOutcome.UNKNOWN_TOOL,
            )
        )
        return ToolCallRecord(
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            server=result.server,
            outcome=result.outcome,
            is_error=result.outcome.is_error,
            content=truncate(result.content, self._max_chars),
            duration_s=duration,
        )

    async def _execute(
        self, step: int, index: int, call: ToolCall, timeout_s: float
    ) -> DispatchResult:
        resolution = self._toolbox.resolve(call.name)
        if resolution is None:
            return DispatchResult(ToolOutcome.UNKNOWN_TOOL, f"Error: Unknown tool '{call.name}'")
        if isinstance(resolution, MissingGrant):
            self._deny(step, resolution)
            message = f"Error: Missing grant {resolution.required_grant}"
            return DispatchResult(ToolOutcome.MISSING_GRANT, message)
        if isinstance(resolution, NotAllowed):
            self._deny(step, resolution)
            message = f"Error: Tool '{resolution.name}' is not allowed in this task"
            return DispatchResult(ToolOutcome.NOT_ALLOWED, message)
        server = resolution.server
        arguments, problem = self._parse_arguments(resolution, call)
        if problem is not None:
            return DispatchResult(ToolOutcome.INVALID_ARGUMENTS, problem, server)
        refusal = await self._refusal(call.name, arguments)
        if refusal is not None:
            return DispatchResult(ToolOutcome.REFUSED, f"Error: {refusal}", server)
        ctx = CallContext(
            task_id=self._task_id,
            agent_id=self._agent_id,
            step=step,
            index=index,
            timeout_s=timeout_s,
        )
        return await self._call(server, call.name, arguments, ctx)

    async def _call(
        self, server: str, name: str, arguments: dict[str, Any], ctx: CallContext
    ) -> DispatchResult:
        """The call itself, on a granted tool with valid arguments."""
        try:
            # The toolbox honours ctx.timeout_s itself; this backstop catches one that does not.
            with call_timeout(ctx.timeout_s + _TIMEOUT_BACKSTOP_S):
                result = await self._toolbox.call(name, arguments, ctx)
        except TimeoutError:
            message = f"Error: tool '{name}' timed out after {ctx.timeout_s:.1f} s"
            return DispatchResult(ToolOutcome.TIMEOUT, message, server)
        except ToolFailed as exc:
            return DispatchResult(ToolOutcome.ERROR, f"Error: {exc.message}", server)
        except Exception as exc:  # a broken tool must not end the task
            message = f"Error: tool '{name}' failed: {exc}"
            return DispatchResult(ToolOutcome.ERROR, message, server)
        if result.refused:
            return DispatchResult(ToolOutcome.REFUSED, result.content, server)
        outcome = ToolOutcome.ERROR if result.is_error else ToolOutcome.OK
        return DispatchResult(outcome, result.content, server)

    def _deny(self, step: int, refused: MissingGrant | NotAllowed) -> None:
        """A call outside the agent's grants or the task's allowed_tools; under strict
        grants (the toolbox says so in ``refused``) it ends the run."""
        required_grant = refused.required_grant if isinstance(refused, MissingGrant) else ""
        reason = ToolOutcome.MISSING_GRANT if required_grant else ToolOutcome.NOT_ALLOWED
        self._events.emit(
            GrantDenied(
                step=step,
                tool=refused.name,
                required_grant=required_grant,
                reason=reason,
                strict=refused.strict,
            )
        )
        if refused.strict:
            without = (
                f"without grant {required_grant!r}"
                if required_grant
                else "outside the task's allowed_tools"
            )
            raise AutonomyViolation(
                f"agent {self._agent_id!r} called {refused.name!r} {without} (strict grants)"
            )

    def _parse_arguments(
        self, resolution: Granted, call: ToolCall
    ) -> tuple[dict[str, Any], str | None]:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return {}, f"Error: arguments for tool '{call.name}' are not valid JSON: {exc}"
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            return {}, f"Error: arguments for tool '{call.name}' must be a JSON object, got {kind}"
        problem = self._schema_problem(resolution.spec, arguments)
        if problem is not None:
            return {}, f"Error: invalid arguments for tool '{call.name}': {problem}"
        return arguments, None

    def _schema_problem(self, spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
        """What is wrong with ``arguments`` for the tool's schema; None when they fit (or
        when the schema itself is broken: its tool then runs unchecked)."""
        check = self._checks.get(spec.name)
        if check is None:
            check = self._checks[spec.name] = schema_check(spec.input_schema)
        return check.problem(arguments)

    async def _refusal(self, name: str, arguments: dict[str, Any]) -> str | None:
        try:
            verdict = self._can_execute(name, arguments)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:
            # An operator's check that breaks refuses the call: it must never wave one through.
            log_event(
                "can_execute_tool_failed",
                "error",
                task=self._task_id,
                agent=self._agent_id,
                tool=name,
                error=f"{type(exc).__name__}: {exc}",
            )
            return f"tool '{name}' was not run: the operator's tool check failed"
        if verdict is None or verdict is True:
            return None
        if isinstance(verdict, str) and verdict:
            return verdict
        return f"tool '{name}' was not run: the operator's tool check refused it"


REPEATED_READ_NOTE = (
    "Your call to {tool} is the same as in step {step}, so it was not run again: its result is "
    "the same as then. {next}"
)
ANSWER_NOW = "Answer now."
# A small model that repeats a read is stuck on it: named, a read it has not made yet is the
# way out it takes (Qwen2.5-Coder 1.5B, asked to read a link, searched the Hub four times
# with "try something else" and fetched the page once web__fetch was named).
TRY_UNTRIED = "Answer now, or try a tool you have not used yet: {tools}."


def repeated_read_note(tool: str, step: int, untried: Sequence[str]) -> str:
    """The worker's note after a repeated read, naming the read tools not used yet."""
    if not untried:
        return REPEATED_READ_NOTE.format(tool=tool, step=step, next=ANSWER_NOW)
    listed = ", ".join(untried[:-1]) + " or " + untried[-1] if len(untried) > 1 else untried[0]
    following = TRY_UNTRIED.format(tools=listed)
    return REPEATED_READ_NOTE.format(tool=tool, step=step, next=following)


class RepeatedReads:
    """The earlier result of each read-only call: an identical repeat gets it back, not run.

    A small model often repeats a read it already has the answer to; running it again
    costs time and tells it nothing new, while a note that says so (``REPEATED_READ_NOTE``,
    a message of the worker's own, outside the untrusted tool result) may turn it to answer.
    Only successful results are kept: a failed read may succeed when run again.
    """

    def __init__(self) -> None:
        self._results: dict[tuple[str, str], tuple[int, ToolCallRecord]] = {}

    def earlier(self, call: ToolCall) -> tuple[int, ToolCallRecord] | None:
        """(step, record) of the same call made before, if it is remembered."""
        return self._results.get((call.name, _canonical(call.arguments)))

    def remember(self, step: int, record: ToolCallRecord) -> None:
        key = (record.name, _canonical(record.arguments))
        if record.outcome is ToolOutcome.OK and key not in self._results:
            self._results[key] = (step, record)

    @staticmethod
    def repeat(call: ToolCall, earlier: ToolCallRecord) -> ToolCallRecord:
        """The record of ``call`` answered with the result of ``earlier`` (not run)."""
        return dataclasses.replace(
            earlier, call_id=call.id, arguments=call.arguments, duration_s=0.0
        )


class ToolLoopGuard:
    """Stops runs that spin: an identical call repeated too often, or steps that only fail."""

    def __init__(self, *, max_same_call_repeats: int, max_consecutive_error_steps: int) -> None:
        self._max_repeats = max_same_call_repeats
        self._max_error_steps = max_consecutive_error_steps
        self._seen: dict[tuple[str, str], int] = {}
        self.consecutive_error_steps = 0

    def repeats_too_often(self, call: ToolCall) -> bool:
        """Counts the call; true when it is made more than the allowed number of times."""
        key = (call.name, _canonical(call.arguments))
        count = self._seen.get(key, 0) + 1
        self._seen[key] = count
        return count > self._max_repeats

    def replay(self, steps: Sequence[StepRecord]) -> None:
        """Count the calls of a restored checkpoint as if they had just run."""
        for step in steps:
            for record in step.tool_calls:
                self.repeats_too_often(
                    ToolCall(id=record.call_id, name=record.name, arguments=record.arguments)
                )
            if step.tool_calls and not step.pending_calls:
                self.step_finished(step.tool_calls)

    def step_finished(self, results: list[ToolCallRecord]) -> bool:
        """True when this step made the run reach the consecutive failed-steps limit."""
        if results and all(record.is_error for record in results):
            self.consecutive_error_steps += 1
        else:
            self.consecutive_error_steps = 0
        return self.consecutive_error_steps >= self._max_error_steps


# One encoder for every call (json.dumps with options builds a new one each time).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _canonical(arguments: str) -> str:
    try:
        return _CANONICAL.encode(json.loads(arguments))
    except (json.JSONDecodeError, TypeError):
        return arguments
