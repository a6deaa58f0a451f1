"""The crash family: a task whose tool writes on the Hub, then whose process dies during the
model's next turn; after the re-run the Hub must hold every effect exactly once. The crash
and concurrent-worker tests share its script (``side_effect_then_slow``), its wait for the
tool's effect and its check (``assert_everything_happened_once``).
"""

from __future__ import annotations

from typing import Any

from tests.chaos.harness import ChaosStack
from tests.support.workers import wait_until

# The model's long think while the test pulls the plug; it never ends in a passing test.
KILL_WINDOW_S = 60


def side_effect_then_slow(marker: str, *, second_call: dict[str, Any] | None = None) -> list[Any]:
    """Turn 1 writes on the Hub through a tool; turn 2 is slow, and the process dies during it
    (with ``second_call``, turn 2 calls that tool after a short think); the re-run asks the
    model again and gets turn 3, the final answer."""
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "name": "hub__create_post",
                    "arguments": {"content": f"Side effect {marker}", "community": "m/general"},
                }
            ]
        },
    ]
    if second_call is not None:
        turns.append({"tool_calls": [second_call], "delay_s": 6})
        turns.append({"text": f"Final answer {marker}"})
    else:
        turns.append({"text": "never delivered", "delay_s": KILL_WINDOW_S})
        turns.append({"text": f"Final answer {marker}"})
    return turns


def wait_for_side_effect(chaos: ChaosStack, marker: str) -> None:
    wait_until(
        lambda: any(f"Side effect {marker}" in p["content"] for p in chaos.hub_state()["posts"]),
        60,
        "the tool's post",
    )


def assert_everything_happened_once(
    chaos: ChaosStack, task_id: str, marker: str, *, timeout_s: float = 90
) -> None:
    """The guarantees of a crash: one tool effect, one reply, one consumption record."""
    assert chaos.wait_for_status(task_id, timeout_s=timeout_s) == "finished"
    report = chaos.report(task_id)
    assert report["outcome"] == "completed", report
    state = chaos.hub_state()
    side_effects = [p for p in state["posts"] if f"Side effect {marker}" in p["content"]]
    assert len(side_effects) == 1, side_effects
    # The tool was not called again: no idempotent replay reached the Hub either.
    assert state["replays"] == 0
    post_id = chaos.job(task_id).args[0]["post_id"]
    replies = chaos.replies_to(post_id)
    assert [reply["content"] for reply in replies] == [f"Final answer {marker}"]
    assert len(chaos.consumption_of(task_id)) == 1
    assert chaos.outbox_size() == 0
    # The re-run replayed the checkpoint: its first model request already holds the
    # tool's result, and the model was never asked for step 1 again.
    requests = chaos.llm.requests(task_id)
    rerun_first = requests[-1]["body"]["messages"]
    assert any("Created post" in str(message.get("content")) for message in rerun_first)
    assert report["tool_calls"] >= 1
