"""Each outcome carries its effects: the rules of the table in docs/concepts/outcomes.md."""

from __future__ import annotations

from worker.exceptions import AutonomyViolation, ExecutorError, ModelAuthError, ModelUnavailable
from worker.task import Outcome

LIMIT_OUTCOMES = {Outcome.MAX_ITERATIONS, Outcome.MAX_TOKENS, Outcome.DEADLINE, Outcome.BUDGET}
FAILING = {Outcome.MODEL_ERROR, Outcome.AUTONOMY_VIOLATION, Outcome.INVALID_TASK, Outcome.ERROR}


def test_completed_and_limits_answer_and_nothing_else_does() -> None:
    assert {outcome for outcome in Outcome if outcome.answers} == {
        Outcome.COMPLETED
    } | LIMIT_OUTCOMES


def test_a_skipped_task_neither_answers_nor_fails_nor_posts_an_error() -> None:
    skipped = Outcome.SKIPPED
    assert not (skipped.answers or skipped.fails_job or skipped.posts_error)


def test_failing_outcomes_fail_the_job_and_post_an_error() -> None:
    assert {outcome for outcome in Outcome if outcome.fails_job} == FAILING
    assert {outcome for outcome in Outcome if outcome.posts_error} == FAILING | {Outcome.TOOL_LOOP}


def test_only_failures_that_would_repeat_are_never_retried() -> None:
    never_retried = {outcome for outcome in Outcome if outcome.never_retried}
    assert never_retried == {Outcome.INVALID_TASK, Outcome.AUTONOMY_VIOLATION, Outcome.MODEL_ERROR}
    assert Outcome.ERROR not in never_retried  # a crash may not repeat: rq may run it again


def test_outcomes_keep_their_wire_values() -> None:
    assert [outcome.value for outcome in Outcome] == [
        "completed",
        "max_iterations",
        "max_tokens",
        "deadline",
        "budget",
        "tool_loop",
        "cancelled",
        "skipped",
        "budget_unhealthy",
        "requeued",
        "model_error",
        "autonomy_violation",
        "invalid_task",
        "error",
    ]
    assert Outcome("tool_loop") is Outcome.TOOL_LOOP and f"{Outcome.DEADLINE}" == "deadline"


def test_an_error_ends_a_run_with_the_outcome_its_class_calls_for() -> None:
    assert Outcome.of_error(AutonomyViolation("x")) is Outcome.AUTONOMY_VIOLATION
    assert Outcome.of_error(ModelAuthError("x")) is Outcome.MODEL_ERROR
    assert Outcome.of_error(ModelUnavailable("x")) is Outcome.MODEL_ERROR
    assert Outcome.of_error(ExecutorError("x")) is Outcome.ERROR
    assert Outcome.of_error(RuntimeError("x")) is Outcome.ERROR
