"""Loop observers a task attaches: what the loop reports, turned into metrics."""

from __future__ import annotations

from worker.loop import GrantDenied, LlmCalled, LoopEvent, LoopObserver, ToolCalled, observing
from worker.metrics import JobMetrics

# Tool names no configuration knows share one metric series.
OTHER_TOOL_LABEL = "other"


def metrics_observer(metrics: JobMetrics, agent_id: str) -> LoopObserver:
    """The loop observer a task attaches: Prometheus increments per model and tool call."""

    @observing(LlmCalled, ToolCalled, GrantDenied)
    def observe(event: LoopEvent) -> None:
        if isinstance(event, LlmCalled):
            metrics.llm_call(
                provider=event.provider,
                model=event.model,
                status=event.status,
                tokens_input=event.usage.input_tokens,
                tokens_output=event.usage.output_tokens,
                tokens_cache_read=event.usage.cache_read_tokens,
                tokens_cache_write=event.usage.cache_write_tokens,
            )
        elif isinstance(event, ToolCalled):
            metrics.tool_call(
                server=event.server or "none",
                # A name the model made up is not a tool: one series for all of them.
                tool=event.tool if event.known else OTHER_TOOL_LABEL,
                outcome=event.outcome,
                duration_s=event.duration_s,
            )
        elif isinstance(event, GrantDenied):
            metrics.grant_denied(agent=agent_id, tool=event.tool)

    return observe
