"""Hub API v1 payloads as pydantic models.

Models ignore fields they do not know (the Hub may add some) and default the
optional ones, so a newer Hub does not break an older worker.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# overall_health values of the collective budget shape that mean "stop spending".
_UNHEALTHY_STATES = frozenset(
    {"unhealthy", "critical", "exceeded", "exhausted", "over_budget", "over-budget", "blocked"}
)


# The one visibility that lets anyone read a post.
PUBLIC = "public"


class _WireModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Author(_WireModel):
    id: str
    name: str = ""

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_id(cls, payload: Any) -> Any:
        if isinstance(payload, str):
            return {"id": payload, "name": payload}
        if isinstance(payload, dict) and not payload.get("name") and payload.get("id"):
            return {**payload, "name": payload["id"]}
        return payload


class Comment(_WireModel):
    id: str
    author: Author
    content: str = ""
    post_id: str | None = None
    parent_id: str | None = None
    created_at: datetime | None = None


class Post(_WireModel):
    id: str
    author: Author
    title: str | None = None
    content: str = ""
    community: str | None = None
    parent_id: str | None = None
    created_at: datetime | None = None
    # Who may read the post, as the Hub says: "public", or "direct" (a direct message) or
    # any other word for less; None when the Hub does not say (the worker then fails closed,
    # unless UNMARKED_POSTS=public).
    visibility: str | None = None
    # Filled only by get_post (include_comments=true); feeds and search leave it empty.
    comments: list[Comment] = Field(default_factory=list)

    @property
    def is_public(self) -> bool | None:
        """Whether the Hub says anyone may read it; None when it does not say."""
        return None if self.visibility is None else self.visibility.strip().lower() == PUBLIC


class CreatedPost(_WireModel):
    id: str
    created_at: datetime | None = None
    author: Author | None = None


class CreatedComment(_WireModel):
    id: str
    post_id: str | None = None
    created_at: datetime | None = None
    author: Author | None = None


class AgentSummary(_WireModel):
    id: str
    name: str = ""
    last_activated_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_id(cls, payload: Any) -> Any:
        if isinstance(payload, dict) and not payload.get("name") and payload.get("id"):
            return {**payload, "name": payload["id"]}
        return payload


class ConsumptionRecord(_WireModel):
    """What one task consumed; ``cost_known=False`` when the model's price is unknown."""

    agent_id: str
    tokens_input: int = Field(ge=0)
    tokens_output: int = Field(ge=0)
    cost_usd: float = Field(ge=0)
    activation_id: str
    task_type: str
    duration_seconds: float = Field(ge=0)
    outcome: str
    cost_known: bool = True
    # Of tokens_input: read from the provider's prompt cache, and written to it.
    tokens_cache_read: int = Field(default=0, ge=0)
    tokens_cache_write: int = Field(default=0, ge=0)


class BudgetHealth(_WireModel):
    """Budget health in either shape the Hub answers, flattened.

    Simple shape: ``{daily_limit, daily_used, monthly_limit, monthly_used, healthy}``.
    Collective shape: ``{tools: {...}, collective: {total_budget_usd, total_used_usd,
    overall_health}}``. ``healthy`` is always set; ``shape`` says which one came.
    """

    healthy: bool
    shape: Literal["simple", "collective"] = "simple"
    daily_limit: float | None = None
    daily_used: float | None = None
    monthly_limit: float | None = None
    monthly_used: float | None = None
    total_budget_usd: float | None = None
    total_used_usd: float | None = None
    overall_health: str | None = None
    tools: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _accept_both_shapes(cls, payload: Any) -> Any:
        if not isinstance(payload, dict):
            return payload
        collective = payload.get("collective")
        if isinstance(collective, dict):
            flat: dict[str, Any] = {**collective, "shape": "collective"}
            flat["tools"] = payload.get("tools") or {}
            overall = collective.get("overall_health")
            if isinstance(overall, bool):
                flat["overall_health"] = "healthy" if overall else "unhealthy"
            flat.setdefault("healthy", _collective_is_healthy(collective))
            return flat
        if "healthy" not in payload:
            return {**payload, "healthy": _within_limits(payload)}
        return payload

    def summary(self) -> str:
        """One short line for the model, e.g. "Budget: $1.20 of $5.00 used today (24%), ..."."""
        if self.shape == "collective":
            used, limit = self.total_used_usd, self.total_budget_usd
            line = f"Budget: {_amount(used, limit)} used overall{_percent(used, limit)}"
            if self.overall_health:
                line += f", health {self.overall_health}"
        else:
            parts = []
            if self.daily_used is not None:
                daily = _amount(self.daily_used, self.daily_limit)
                parts.append(f"{daily} used today{_percent(self.daily_used, self.daily_limit)}")
            if self.monthly_used is not None:
                parts.append(f"{_amount(self.monthly_used, self.monthly_limit)} this month")
            line = "Budget: " + (", ".join(parts) if parts else "no usage reported")
        return line + ("." if self.healthy else "; budget exhausted.")


def _amount(used: float | None, limit: float | None) -> str:
    spent = f"${used or 0.0:.2f}"
    return spent if limit is None else f"{spent} of ${limit:.2f}"


def _percent(used: float | None, limit: float | None) -> str:
    if limit is None or limit <= 0:
        return ""
    return f" ({round(100 * (used or 0.0) / limit)}%)"


def _collective_is_healthy(collective: dict[str, Any]) -> bool:
    overall = collective.get("overall_health")
    if isinstance(overall, bool):
        return overall
    if isinstance(overall, str) and overall.strip().lower() in _UNHEALTHY_STATES:
        return False
    budget, used = collective.get("total_budget_usd"), collective.get("total_used_usd")
    if isinstance(budget, int | float) and isinstance(used, int | float) and budget > 0:
        return used < budget
    return True


def _within_limits(payload: dict[str, Any]) -> bool:
    for used_key, limit_key in (("daily_used", "daily_limit"), ("monthly_used", "monthly_limit")):
        used, limit = payload.get(used_key), payload.get(limit_key)
        if isinstance(used, int | float) and isinstance(limit, int | float) and used >= limit:
            return False
    return True
