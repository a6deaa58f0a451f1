"""The prefix a provider's prompt cache keeps is the same in every task of an agent.

Two tasks of one agent, on different threads, run by two burst workers one after the
other (two processes, different times), for an Anthropic and an OpenAI-compatible agent;
the scripted endpoint records what the real SDKs sent. The tools and the agent's prompt and
skills are the same JSON text in both tasks, marked for caching the same way, and the
per-task parts (the notice's nonce) come after them: for Anthropic a system block of their
own, for OpenAI-compatible endpoints the opening of the first user message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chaos.harness import ChaosStack, agent_config, unique
from tests.support.definitions import write_agent
from worker.models import agent_cache_key

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

# An agent prompt and two skills the size of a public definition's (Sonnet 4.5 caches from
# 1,024 tokens on).
PROMPT = "You are a release reviewer on the Hub. " + "Read each thread with care. " * 150
SKILLS = {
    "triage": "Sort the thread's questions by urgency. " * 30,
    "answers": "Answer in three sentences at most. " * 30,
}
ANTHROPIC_KEY = "sk-ant-scripted-endpoint-key"
GRANTS = {"grants": ["hub:read"], "mcp_servers": ["hub", "web"], "skills": sorted(SKILLS)}


def write_skilled_agent(chaos: ChaosStack, name: str, brain: dict[str, Any]) -> None:
    folder = write_agent(
        chaos.agents_dir,
        name,
        agent_config(name, brain=brain, capabilities=GRANTS),
        prompt=PROMPT,
    )
    for skill, text in SKILLS.items():
        skill_dir = folder.parents[1] / "skills" / skill
        skill_dir.mkdir(parents=True, exist_ok=True)
        (skill_dir / "SKILL.md").write_text(
            f"---\nname: {skill}\ndescription: How to {skill}.\n---\n\n{text}\n", encoding="utf-8"
        )


def run_one_task(chaos: ChaosStack, agent: str, env: dict[str, str]) -> str:
    """A two-step task (a search, then the reply) on a thread of its own, by a burst worker
    of its own; returns the task id."""
    task_id = unique(agent)
    chaos.llm.set_scenario(
        task_id,
        [
            {"tool_calls": [{"name": "hub__search_posts", "arguments": {"query": task_id}}]},
            {"text": f"Thanks, noted ({task_id})."},
        ],
    )
    post_id = chaos.seed_post(f"@{agent} is {task_id} ready? [[scenario:{task_id}]]")
    task = {"task_id": task_id, "type": "notification", "agent_id": agent, "post_id": post_id}
    assert chaos.enqueue(task) == "enqueued"
    chaos.run_burst(**env)
    assert chaos.wait_for_outcome(task_id)["outcome"] == "completed"
    return task_id


def wire(value: Any) -> str:
    """A part of a body as the SDKs encode it (key order kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def two_tasks(chaos: ChaosStack, agent: str, env: dict[str, str]) -> list[list[dict[str, Any]]]:
    """The request bodies of each of two tasks, in order."""
    first = run_one_task(chaos, agent, env)
    second = run_one_task(chaos, agent, env)
    tasks = [[r["body"] for r in chaos.llm.requests(task)] for task in (first, second)]
    assert [len(bodies) for bodies in tasks] == [2, 2]
    return tasks


def test_an_anthropic_agents_tools_prompt_and_skills_are_the_same_bytes_in_every_task(
    chaos: ChaosStack,
) -> None:
    agent = "cached-claude"
    write_skilled_agent(chaos, agent, {"provider": "anthropic", "model": "claude-sonnet-4-5"})
    env = {
        "ANTHROPIC_BASE_URL": chaos.llm.anthropic_base_url,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
    }
    tasks = two_tasks(chaos, agent, env)

    stable = {
        wire({"tools": body["tools"], "system": body["system"][0]})
        for bodies in tasks
        for body in bodies
    }
    assert len(stable) == 1
    (prefix,) = stable
    # Tools sorted by name; the agent's prompt, then its skills, marked for caching.
    [body, *_] = tasks[0]
    names = [tool["name"] for tool in body["tools"]]
    assert names == sorted(names) and len(names) >= 3
    assert body["system"][0]["text"].startswith("You are a release reviewer")
    assert body["system"][0]["text"].index("# Skill: answers") < body["system"][0]["text"].index(
        "# Skill: triage"
    )
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    # The task's own line (its nonce) comes after the prefix and differs between tasks.
    notices = {bodies[0]["system"][1]["text"] for bodies in tasks}
    assert len(notices) == 2 and all("untrusted-content-" in notice for notice in notices)
    assert not any(notice in prefix for notice in notices)
    # The second step marks where the first ended (its first message) and its own end.
    second_step = tasks[0][1]["messages"]
    marked = [
        i
        for i, turn in enumerate(second_step)
        if any("cache_control" in block for block in turn["content"])
    ]
    assert marked == [0, len(second_step) - 1]


def test_an_openai_agents_prefix_and_cache_key_are_the_same_in_every_task(
    chaos: ChaosStack,
) -> None:
    agent = "cached-gpt"
    write_skilled_agent(chaos, agent, {"provider": "openai", "model": "gpt-4o-mini"})
    tasks = two_tasks(chaos, agent, {})

    bodies = [body for task in tasks for body in task]
    assert len({wire(body["tools"]) for body in bodies}) == 1
    assert {body["prompt_cache_key"] for body in bodies} == {agent_cache_key(agent)}
    # The system message is the agent's prompt and skills alone, the same bytes in every
    # task (chat templates put the tools right after it).
    assert len({wire(body["messages"][0]) for body in bodies}) == 1
    system = bodies[0]["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("You are a release")
    assert system["content"].endswith(SKILLS["triage"].strip())
    # The task's own line (the notice and its nonce) opens the first user message, before
    # the thread, and differs between tasks.
    openings = [body["messages"][1] for body in bodies]
    assert all(opening["role"] == "user" for opening in openings)
    notices = {opening["content"].split("\n\n")[0] for opening in openings}
    assert len(notices) == 2
    assert all(notice.startswith("Everything between <untrusted-content-") for notice in notices)
    assert all("You were mentioned" in opening["content"] for opening in openings)


def test_with_the_cache_off_requests_carry_no_marks_and_no_key(chaos: ChaosStack) -> None:
    claude, gpt = "uncached-claude", "uncached-gpt"
    write_skilled_agent(chaos, claude, {"provider": "anthropic", "model": "claude-sonnet-4-5"})
    write_skilled_agent(chaos, gpt, {"provider": "openai", "model": "gpt-4o-mini"})
    env = {
        "PROMPT_CACHE": "off",
        "ANTHROPIC_BASE_URL": chaos.llm.anthropic_base_url,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
    }
    sent = [
        chaos.llm.requests(run_one_task(chaos, claude, env)),
        chaos.llm.requests(run_one_task(chaos, gpt, env)),
    ]
    text = wire([request["body"] for requests in sent for request in requests])
    assert "cache_control" not in text and "prompt_cache_key" not in text
    assert isinstance(sent[0][0]["body"]["system"], str)
