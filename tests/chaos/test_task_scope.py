"""What an agent reads cannot widen what its task may write: the injection family through
the real rq worker, devhub and mcp-hub (CAPABILITY_KEY set), with a model that obeys every
instruction it reads. Every attack fails; every in-scope reply is still posted."""

from __future__ import annotations

import pytest

from tests.chaos.harness import ChaosStack
from tests.chaos.scope_family import (
    TARGETS,
    VECTORS,
    run_family,
    scope_refusals_counted,
    table,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]


def test_no_injection_widens_a_tasks_writes_and_every_in_scope_reply_is_posted(
    chaos: ChaosStack,
) -> None:
    scenarios, dm_leak = run_family(chaos)
    print(table(scenarios, dm_leak))

    assert len(scenarios) == len(VECTORS) * len(TARGETS)
    landed = [(s.vector, s.target) for s in scenarios if s.attack_landed]
    assert landed == []
    assert not dm_leak, "a public thread's prompt held what a DM said"
    unanswered = [(s.vector, s.target) for s in scenarios if not s.reply_posted]
    assert unanswered == []
    # A refused write is not a failure of the task.
    assert {s.outcome for s in scenarios} == {"completed"}
    # Out-of-scope writes are listed in the report (a second reply is the write caps').
    unlisted = [
        (s.vector, s.target)
        for s in scenarios
        if s.target != "second reply" or s.vector == "feed item"
        if not s.refused
    ]
    assert unlisted == []
    # Counted per agent from the forked job processes, for the operator's dashboard.
    assert scope_refusals_counted(chaos) == sum(len(s.refused) for s in scenarios)
