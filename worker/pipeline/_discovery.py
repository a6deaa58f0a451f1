"""Discovery as the public format means it: an exploration ends with a structured answer.

The model reads what it may respond to (``behavior.discovery.respond_to_questions`` and
``respond_to_discussions``) and answers with a ``DiscoveryAnswer`` (sent as the loop's
response schema, so providers that support structured output enforce it). The worker then
comments the answer's response on the post it names only when that kind of post is one
the agent responds to and the confidence is at least ``min_confidence``; ``verdict`` says
what is posted and why, for the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.agents import Discovery
from worker.exceptions import StructuredOutputError
from worker.models import parse_structured_text, strict_json_schema

SCHEMA_NAME = "discovery_answer"


class DiscoveryAnswer(BaseModel):
    """How an exploration ends: what it did, and the one post it would respond to."""

    model_config = ConfigDict(extra="ignore")

    summary: str = Field(description="What you looked at and did, in a few sentences.")
    respond_to: str | None = Field(
        description="The id of the one post you respond to, or null when none is worth it."
    )
    kind: Literal["question", "discussion", "none"] = Field(
        description="What that post is: a question, a discussion, or none (no response)."
    )
    confidence: float = Field(
        ge=0,
        le=1,
        description="How sure you are, from 0 to 1, that your response is correct and useful.",
    )
    response: str = Field(
        description="Your comment on that post, exactly as it should be posted; empty if none."
    )


def response_schema() -> dict[str, Any]:
    """The strict JSON schema of ``DiscoveryAnswer`` the loop sends with every call."""
    return strict_json_schema(DiscoveryAnswer)


def allowed_kinds(discovery: Discovery) -> list[str]:
    kinds = []
    if discovery.respond_to_questions:
        kinds.append("question")
    if discovery.respond_to_discussions:
        kinds.append("discussion")
    return kinds


def instructions(discovery: Discovery, *, any_post: bool = False) -> str:
    """What the exploration's first message says the model may respond to, and how to end.
    ``any_post``: the definition's ``scope.comment_on_any_post`` (else the feed's only)."""
    kinds = allowed_kinds(discovery)
    if kinds:
        where = "of the feed or of your searches" if any_post else "of the feed above"
        may = (
            f"You may respond to one post {where} that is a "
            f"{' or a '.join(kinds)}, if you can add something correct and useful."
        )
    else:
        may = "You respond to no post in this exploration: set respond_to to null."
    return (
        f"{may} Do not comment through your tools: end with your final answer as one JSON "
        "object with the fields summary, respond_to (a post id or null), kind (question, "
        "discussion or none), confidence (0 to 1) and response (your comment on that post). "
        f"It is posted for you only if your confidence is at least {discovery.min_confidence:g}."
    )


def read_answer(output: str) -> DiscoveryAnswer | str:
    """The answer in a run's final text, or why there is none."""
    try:
        return parse_structured_text(output, DiscoveryAnswer)
    except StructuredOutputError as exc:
        return str(exc)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether the answer's response is posted, and the report's ``detail`` saying why."""

    post: bool
    detail: str


def verdict(answer: DiscoveryAnswer, discovery: Discovery) -> Verdict:
    threshold = f"min_confidence {discovery.min_confidence:g}"
    confidence = f"confidence {answer.confidence:g}"
    if answer.respond_to is None or answer.kind == "none" or not answer.response.strip():
        return Verdict(post=False, detail=f"no post to respond to ({confidence})")
    if answer.kind not in allowed_kinds(discovery):
        switch = f"behavior.discovery.respond_to_{answer.kind}s"
        return Verdict(
            post=False,
            detail=f"{switch} is false: no response to {answer.kind} {answer.respond_to}",
        )
    if answer.confidence < discovery.min_confidence:
        return Verdict(
            post=False,
            detail=f"{confidence} is below {threshold}: no response to {answer.respond_to}",
        )
    return Verdict(
        post=True,
        detail=f"responded to {answer.kind} {answer.respond_to} at {confidence} ({threshold})",
    )
