"""GRANT_POLICY caps the scope opt-ins: a definition that widens its tasks' scope beyond what
the operator allows is refused by ``agent-worker check`` and when a real worker loads it,
with one line naming the agent, the opt-in and the policy (docs/task-scope.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.definitions import write_agent
from tests.support.e2e import E2E
from tests.support.workers import parse_events

pytestmark = pytest.mark.integration

WIDE = "wide-agent"
ANNOUNCER = "announcer"
POLICY = """
default:
  allowed_grants: ["hub:*"]
  # No definition may let its tasks comment anywhere, nor post outside m/announcements...
  allow_comment_on_any_post: false
  allowed_post_in: [m/announcements]
agents:
  # ...but this one may post in any community.
  announcer: {allowed_post_in: ["*"]}
"""


def definition(name: str, scope: str) -> str:
    return f"""
name: {name}
type: native
brain: {{provider: openai, model: {name}, max_tokens: 300}}
capabilities: {{grants: [hub:read, hub:write], mcp_servers: [hub]}}
behavior:
  limits: {{max_daily_comments: 10000, max_responses_per_thread: 10000, min_interval_seconds: 0}}
scope: {scope}
"""


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Path, Path]:
    """(AGENTS_DIR, GRANT_POLICY): one agent beyond the policy, one within it."""
    agents = tmp_path / "definitions"
    write_agent(agents, WIDE, definition(WIDE, "{comment_on_any_post: true, post_in: [m/general]}"))
    write_agent(agents, ANNOUNCER, definition(ANNOUNCER, "{post_in: [m/general]}"))
    policy = tmp_path / "grant-policy.yaml"
    policy.write_text(POLICY)
    return agents, policy


def refusal(policy: Path) -> str:
    return (
        f"agents/{WIDE}/config.yaml: scope.comment_on_any_post, scope.post_in m/general: "
        f"not allowed for agent '{WIDE}' by GRANT_POLICY ({policy})"
    )


def test_check_refuses_an_opt_in_beyond_grant_policy_in_one_line(
    e2e: E2E, fleet: tuple[Path, Path]
) -> None:
    agents, policy = fleet
    checked = e2e.agent_worker_cli(
        "check", "--offline", AGENTS_DIR=str(agents), GRANT_POLICY=str(policy)
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    errors = [line for line in checked.stdout.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {refusal(policy)}"]
    assert "1 of 2 agent definitions load" in checked.stdout


def test_a_worker_refuses_to_load_a_definition_widened_beyond_grant_policy(
    e2e: E2E, fleet: tuple[Path, Path]
) -> None:
    agents, policy = fleet
    for name in (WIDE, ANNOUNCER):
        e2e.llm.set_scenario(name, [{"text": "On it."}])
        post = e2e.hub.create_post(agent_id="ron", content=f"Hey @{name}, anything new?")
        task = {"task_id": f"t-{name}", "type": "notification", "agent_id": name}
        assert e2e.enqueue({**task, "post_id": post["id"]}) == "enqueued"

    burst = e2e.run_burst(AGENTS_DIR=str(agents), GRANT_POLICY=str(policy))

    assert burst.returncode == 0, burst.stderr[-3000:]
    # Within the policy: the agent runs; beyond it: refused before any model call.
    assert e2e.report(f"t-{ANNOUNCER}")["outcome"] == "completed"
    report = e2e.report(f"t-{WIDE}")
    assert report["outcome"] == "error" and report["llm_calls"] == 0
    assert report["error"]["message"] == refusal(policy)
    assert e2e.llm.requests(WIDE) == []
    assert refusal(policy) in e2e.failure_text(f"t-{WIDE}")
    # The worker said so at start too, as check does.
    problems = [e for e in parse_events(burst.stderr, "config_problem") if e.get("agent") == WIDE]
    assert [refusal(policy).endswith(problem["problem"]) for problem in problems] == [True]
