"""Final-output recovery: a closing turn that only points back ("See my answer above.") is
replaced by the answer it points to, and never by the preamble of a tool call."""

from __future__ import annotations

import fakeredis
import pytest

from tests.support.definitions import SHIPPED_DEMO_AGENTS
from tests.support.pipeline import in_process_hub, task_runtime
from worker.jobs import execute_task
from worker.loop import AgentLoop, Control, LoopSettings, RunLimits, RunResult, StepRecord
from worker.loop._output import is_preamble, recover_output
from worker.models import Message, StopReason, ToolCall, Usage
from worker.models._scripted import ScriptedModel, Turn
from worker.task import Outcome
from worker.tools import LocalToolbox
from worker.tools._local import LocalTool

pytestmark = pytest.mark.anyio

PREAMBLE = "Let me look that up first."
LOOKUP = ("lookup", {"q": "rq"})


def toolbox() -> LocalToolbox:
    return LocalToolbox([LocalTool(name="lookup", function=lambda q: "rq docs: use retries")])


async def run(turns: list[Turn], **settings: object) -> RunResult:
    loop = AgentLoop(
        model=ScriptedModel(turns),
        toolbox=toolbox(),
        system="s",
        settings=LoopSettings(**settings),  # type: ignore[arg-type]
        task_id="t-1",
        agent_id="a",
    )
    return await loop.run([Message(role="user", content="go")])


def step(text: str, *, calls: int = 0, final: bool = False) -> StepRecord:
    return StepRecord(
        index=1,
        text=text,
        stop_reason=StopReason.END_TURN,
        provider="p",
        model="m",
        usage=Usage(),
        requested_calls=tuple(ToolCall(id=f"c{n}", name="t", arguments="{}") for n in range(calls)),
        final=final,
    )


@pytest.mark.parametrize(
    "text",
    [
        PREAMBLE,
        "I'll search the Hub for that.",
        "Okay, let me check the thread.",
        "First, I need to read the docs.",
        "Searching for related posts...",
        "Here is what I will check:",
        "Good question! Let me fetch the page.",
    ],
)
def test_text_announcing_a_tool_call_is_a_preamble(text: str) -> None:
    assert is_preamble(step(text, calls=1))


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42, because of the tool.",
        "Use `rq worker --with-scheduler`: delayed retries only run with a scheduler. " * 4
        + "I'll post this summary in m/general too.",
    ],
)
def test_an_answer_that_comes_with_a_tool_call_is_not_a_preamble(text: str) -> None:
    assert not is_preamble(step(text, calls=1))


def test_text_without_tool_calls_is_never_a_preamble() -> None:
    assert not is_preamble(step(PREAMBLE))


def test_only_a_pointer_is_replaced() -> None:
    steps = [step("The answer is 42.", calls=1), step("See my answer above.")]
    assert recover_output(steps, "See my answer above.") == "The answer is 42."
    assert recover_output(steps, "A new answer.") == "A new answer."
    # No closing text is not a pointer: nothing is recovered.
    assert recover_output(steps, "") == ""


async def test_a_pointer_after_a_preamble_recovers_nothing() -> None:
    result = await run([Turn(text=PREAMBLE, tool_calls=[LOOKUP]), Turn(text="See above.")])
    assert result.outcome is Outcome.COMPLETED
    assert result.output == ""


async def test_a_pointer_recovers_the_front_loaded_answer_not_the_later_preamble() -> None:
    answer = "Retry with `Retry(max=3)`; failed jobs keep their arguments."
    result = await run(
        [
            Turn(text=answer, tool_calls=[LOOKUP]),
            Turn(text=PREAMBLE, tool_calls=[("lookup", {"q": "more"})]),
            Turn(text="See my answer above."),
        ]
    )
    assert result.output == answer


async def test_a_limit_after_a_preamble_gives_the_fallback_not_the_preamble() -> None:
    result = await run(
        [Turn(text=PREAMBLE, tool_calls=[LOOKUP]), Turn(text="")],
        limits=RunLimits(max_iterations=1),
    )
    assert result.outcome is Outcome.MAX_ITERATIONS
    assert result.fallback and PREAMBLE not in result.output


async def test_a_cancelled_run_does_not_report_a_preamble() -> None:
    class CancelSecond:
        polls = 0

        async def poll(self) -> Control:
            self.polls += 1
            return Control(cancelled=self.polls > 1)

    loop = AgentLoop(
        model=ScriptedModel([Turn(text=PREAMBLE, tool_calls=[LOOKUP])]),
        toolbox=toolbox(),
        system="s",
        settings=LoopSettings(),
        task_id="t-1",
        agent_id="a",
        control=CancelSecond(),
    )
    result = await loop.run([Message(role="user", content="go")])
    assert result.outcome is Outcome.CANCELLED
    assert PREAMBLE not in result.output


async def test_a_preamble_is_never_posted_as_the_reply(redis: fakeredis.FakeRedis) -> None:
    key = "hub-key-recovery-0123456"
    model = ScriptedModel(
        [Turn(text=PREAMBLE, tool_calls=[LOOKUP]), Turn(text="See my answer above.")],
        name="gpt-4o-mini",
        provider="openai",
    )

    async with in_process_hub(key) as hub:
        post = await hub.create_post(
            agent_id="alice", content="@demo-agent hi", idempotency_key="s"
        )
        runtime = task_runtime(
            hub, redis, model, agents_dir=SHIPPED_DEMO_AGENTS, toolbox=toolbox(), api_key=key
        )
        task = {"task_id": "t-1", "type": "notification", "agent_id": "demo-agent"}
        verdict = await execute_task({**task, "post_id": post.id}, runtime)
        state = await hub.dev_state()
    assert verdict.report.outcome is Outcome.COMPLETED
    assert state["comments"] == [] and verdict.report.posted == []
