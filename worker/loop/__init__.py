"""The agent loop: reason → tool → observe, with limits as data and observable steps."""

from worker.loop._budget import dearest_price
from worker.loop._clock import DeadlineToolbox
from worker.loop._contract import (
    CallRules,
    Closing,
    Control,
    ControlSource,
    LoopSettings,
    RunResult,
    expired_result,
)
from worker.loop._dispatch import DONE_TOOL, CanExecuteTool, ToolDispatcher
from worker.loop._entry_json import entry_from_json, entry_to_json
from worker.loop._events import (
    EventBus,
    GrantDenied,
    LlmCalled,
    LoopEvent,
    LoopObserver,
    StepFinished,
    StepStarted,
    ToolCalled,
    log_observer,
    observing,
)
from worker.loop._limits import FALLBACK_ANSWER, Limit, RunLimits
from worker.loop._output import truncate
from worker.loop._redacting import ArgumentRedactingToolbox, redacting_arguments
from worker.loop._run import AgentLoop
from worker.loop._state import (
    Journal,
    JournalEntry,
    LoopState,
    MemoryJournal,
    ResponseEntry,
    SteerEntry,
    StepRecord,
    ToolCallRecord,
    ToolEntry,
    ToolOutcome,
)

__all__ = [
    "DONE_TOOL",
    "FALLBACK_ANSWER",
    "AgentLoop",
    "ArgumentRedactingToolbox",
    "CallRules",
    "CanExecuteTool",
    "Closing",
    "Control",
    "ControlSource",
    "DeadlineToolbox",
    "EventBus",
    "GrantDenied",
    "Journal",
    "JournalEntry",
    "Limit",
    "LlmCalled",
    "LoopEvent",
    "LoopObserver",
    "LoopSettings",
    "LoopState",
    "MemoryJournal",
    "ResponseEntry",
    "RunLimits",
    "RunResult",
    "SteerEntry",
    "StepFinished",
    "StepRecord",
    "StepStarted",
    "ToolCallRecord",
    "ToolCalled",
    "ToolDispatcher",
    "ToolEntry",
    "ToolOutcome",
    "dearest_price",
    "entry_from_json",
    "entry_to_json",
    "expired_result",
    "log_observer",
    "observing",
    "redacting_arguments",
    "truncate",
]
