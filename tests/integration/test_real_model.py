"""Opt-in: the real local model (``REALMODEL_TESTS=1``, after ``make eval`` set it up).

llama-server with Qwen2.5-Coder 1.5B at a 4096-token context, and a 200-comment thread:
with ``brain.max_context_tokens`` the prompt is cut to fit and the model answers; without
it the server refuses the request, which is what the window bound is for.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from hub_client import Author, Comment, Post
from tests.support.pipeline import DEMO_AGENTS
from worker.agents import AgentDefinition, AgentStore
from worker.dev.realmodel._server import RunningModel, llama_server
from worker.dev.realmodel._setup import MODELS, cache_dir, model_path, server_binary
from worker.loop import AgentLoop, LoopSettings, RunResult
from worker.models import UntrustedBlocks
from worker.models._openai import OpenAIModel
from worker.pipeline._prompt import first_message, system_prompt, task_instructions
from worker.task import Outcome, Task
from worker.tools import LocalToolbox

SPEC = MODELS["1.5b"]
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        os.environ.get("REALMODEL_TESTS") != "1"
        or not server_binary(cache_dir()).is_file()
        or not model_path(cache_dir(), SPEC).is_file(),
        reason="opt-in: REALMODEL_TESTS=1 after `make eval` set up the real model",
    ),
]


@pytest.fixture(scope="module")
def real_model() -> Iterator[RunningModel]:
    with llama_server(cache_dir(), SPEC, context_tokens=4096) as model:
        yield model


def release_thread() -> Post:
    when = datetime(2026, 11, 24, tzinfo=UTC)
    notes = [
        Comment(
            id=f"c-{n}",
            author=Author(id=("hank", "ivan", "gina")[n % 3]),
            content=f"Note {n}: still collecting opinions on the test matrix for the release.",
            created_at=when,
        )
        for n in range(197)
    ]
    decision = [
        Comment(id="c-197", author=Author(id="hank"), content="Final decision: Thursday."),
        Comment(id="c-198", author=Author(id="ivan"), content="Agreed, Thursday it is."),
        Comment(id="c-199", author=Author(id="gina"), content="@demo-agent which day did we pick?"),
    ]
    return Post(
        id="p-1",
        author=Author(id="gina"),
        content="Release planning for 4.3: let's pick a day.",
        created_at=when,
        comments=notes + decision,
    )


def demo_agent(window: int | None) -> AgentDefinition:
    agent = AgentStore(str(DEMO_AGENTS)).load("demo-agent")
    brain = agent.config.brain.model_copy(update={"max_context_tokens": window, "temperature": 0})
    return dataclasses.replace(agent, config=agent.config.model_copy(update={"brain": brain}))


async def answer_thread(model: RunningModel, window: int | None) -> RunResult:
    agent = demo_agent(window)
    task = Task(task_id="t-real", type="notification", agent_id="demo-agent", post_id="p-1")
    blocks = UntrustedBlocks()
    message = first_message(task, agent, thread=release_thread(), feed=[], blocks=blocks)
    loop = AgentLoop(
        model=OpenAIModel(model.alias, api_key="local", base_url=model.base_url),
        toolbox=LocalToolbox([]),
        system=system_prompt(agent),
        system_context=task_instructions(None, blocks),
        settings=LoopSettings(context_window_tokens=window, max_output_tokens=256),
        task_id="t-real",
        agent_id="demo-agent",
    )
    return await loop.run([message])


async def test_a_200_comment_thread_fits_a_4k_window(real_model: RunningModel) -> None:
    result = await answer_thread(real_model, 4096)
    assert result.outcome is Outcome.COMPLETED, result.detail
    assert result.output.strip() and result.state.usage.input_tokens < 4096
    assert "thursday" in result.output.lower()


async def test_without_the_window_the_server_refuses_the_thread(real_model: RunningModel) -> None:
    result = await answer_thread(real_model, None)
    assert result.outcome is Outcome.MODEL_ERROR
    assert "context" in result.detail.lower()
