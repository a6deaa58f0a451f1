"""What the devhub holds and the rules of Hub API v1 applied to it, without any HTTP.

Every method either returns the JSON answer or raises ``DevHubProblem`` with
the status and message the Hub would answer. With a state file, every write
is saved at once (atomically, see ``_devhub_records``), so a devhub stopped and
started again keeps its posts, agents and idempotency records.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hub_client._devhub_records import (
    DevHubProblem,
    JSONObject,
    Records,
    StoredAnswer,
    iso,
    load_records,
    now_iso,
    optional_flag,
    optional_text,
    parse_time,
    required_amount,
    required_count,
    required_text,
    save_records,
)

DEFAULT_COMMUNITY = "m/general"
PUBLIC = "public"
DEFAULT_DAILY_LIMIT_USD = 10.0
DEFAULT_MONTHLY_LIMIT_USD = 300.0
MAX_PAGE_SIZE = 100

_NUMERIC_BUDGET_OVERRIDES = frozenset(
    {
        "daily_limit",
        "daily_used",
        "monthly_limit",
        "monthly_used",
        "total_budget_usd",
        "total_used_usd",
    }
)
_BUDGET_OVERRIDES = _NUMERIC_BUDGET_OVERRIDES | {"healthy", "collective", "overall_health", "tools"}


class DevHubStore:
    """The devhub's memory; one per app, used from one event loop (no locking needed)."""

    def __init__(self, state_file: Path | None = None) -> None:
        self._state_file = state_file
        self._records = load_records(state_file)

    # -- persistence --------------------------------------------------------------------------

    def save(self) -> None:
        if self._state_file is not None:
            save_records(self._state_file, self._records)

    def _next_id(self, prefix: str) -> str:
        number = self._records.last_ids.get(prefix, 0) + 1
        self._records.last_ids[prefix] = number
        return f"{prefix}-{number}"

    # -- idempotency --------------------------------------------------------------------------

    def replay(self, idempotency_key: str, request: str) -> StoredAnswer | None:
        """The first answer given for this key, counting the replay; None if the key is new."""
        stored = self._records.idempotency.get(idempotency_key)
        if stored is None:
            return None
        if stored["request"] != request:
            raise DevHubProblem(
                422,
                f"Idempotency-Key {idempotency_key!r} was first used for {stored['request']}, "
                f"not {request}",
            )
        self._records.replays += 1
        self.save()
        return StoredAnswer(status=int(stored["status"]), body=stored["body"])

    def remember(self, idempotency_key: str, request: str, answer: StoredAnswer) -> None:
        self._records.idempotency[idempotency_key] = {
            "request": request,
            "status": answer.status,
            "body": answer.body,
        }
        self.save()

    # -- posts and comments -------------------------------------------------------------------

    def create_post(self, body: JSONObject) -> JSONObject:
        agent_id = required_text(body, "agent_id")
        content = required_text(body, "content")
        title = optional_text(body, "title")
        community = normalize_community(optional_text(body, "community") or DEFAULT_COMMUNITY)
        # "direct" for a direct message: read only through its id, never in search or feeds.
        visibility = optional_text(body, "visibility") or PUBLIC
        post = {
            "id": self._next_id("p"),
            "author": self._author(agent_id),
            "title": title,
            "content": content,
            "community": community,
            "visibility": visibility,
            "parent_id": None,
            "created_at": now_iso(),
        }
        self._records.posts.append(post)
        self.save()
        return dict(post)

    def create_comment(self, post_id: str, body: JSONObject) -> JSONObject:
        self._find_post(post_id)
        agent_id = required_text(body, "agent_id")
        content = required_text(body, "content")
        comment = {
            "id": self._next_id("c"),
            "post_id": post_id,
            "author": self._author(agent_id),
            "content": content,
            "parent_id": None,
            "created_at": now_iso(),
        }
        self._records.comments.append(comment)
        self.save()
        return dict(comment)

    def get_post(self, post_id: str, *, include_comments: bool) -> JSONObject:
        post = dict(self._find_post(post_id))
        if include_comments:
            post["comments"] = [dict(c) for c in self._records.comments if c["post_id"] == post_id]
        return post

    def search(
        self, q: str, *, community: str | None, author: str | None, limit: int
    ) -> list[JSONObject]:
        needle = q.strip().lower()
        wanted_community = normalize_community(community) if community else None
        matches = []
        for post in self._public_newest_first():
            if needle and needle not in _searchable_text(post):
                continue
            if wanted_community and post["community"] != wanted_community:
                continue
            if author and author not in (post["author"]["id"], post["author"]["name"]):
                continue
            matches.append(dict(post))
        return matches[:limit]

    def discover(
        self,
        *,
        communities: list[str],
        keywords: list[str],
        exclude_responded: bool,
        agent_id: str | None,
        limit: int,
    ) -> list[JSONObject]:
        wanted_communities = {normalize_community(name) for name in communities}
        wanted_keywords = [keyword.lower() for keyword in keywords]
        responded = self._posts_responded_by(agent_id) if exclude_responded and agent_id else set()
        feed = []
        for post in self._public_newest_first():
            if post["id"] in responded:
                continue
            if wanted_communities or wanted_keywords:
                text = _searchable_text(post)
                in_community = post["community"] in wanted_communities
                if not in_community and not any(keyword in text for keyword in wanted_keywords):
                    continue
            feed.append(dict(post))
        return feed[:limit]

    def _public_newest_first(self) -> list[JSONObject]:
        """Posts anyone may read (a record from before visibilities is public)."""
        return [p for p in self._newest_first() if p.get("visibility", PUBLIC) == PUBLIC]

    def _posts_responded_by(self, agent_id: str) -> set[str]:
        authored = {post["id"] for post in self._records.posts if post["author"]["id"] == agent_id}
        commented = {c["post_id"] for c in self._records.comments if c["author"]["id"] == agent_id}
        return authored | commented

    def _find_post(self, post_id: str) -> JSONObject:
        for post in self._records.posts:
            if post["id"] == post_id:
                return post
        raise DevHubProblem(404, f"post {post_id} not found")

    def _newest_first(self) -> Iterable[JSONObject]:
        # Creation order, not created_at: two posts may share a timestamp.
        return reversed(self._records.posts)

    def _author(self, agent_id: str) -> JSONObject:
        agent = self._records.agents.get(agent_id)
        return {"id": agent_id, "name": agent["name"] if agent else agent_id}

    # -- budget and consumption ---------------------------------------------------------------

    def record_consumption(self, body: JSONObject) -> JSONObject:
        record = {
            "agent_id": required_text(body, "agent_id"),
            "tokens_input": required_count(body, "tokens_input"),
            "tokens_output": required_count(body, "tokens_output"),
            "cost_usd": required_amount(body, "cost_usd"),
            "activation_id": required_text(body, "activation_id"),
            "task_type": required_text(body, "task_type"),
            "duration_seconds": required_amount(body, "duration_seconds"),
            "outcome": required_text(body, "outcome"),
            "cost_known": optional_flag(body, "cost_known", default=True),
        }
        extra = {key: value for key, value in body.items() if key not in record}
        stored = {"id": self._next_id("u"), **extra, **record, "recorded_at": now_iso()}
        self._records.consumption.append(stored)
        self.save()
        return {"id": stored["id"], "recorded": True}

    def budget_health(self, agent_id: str) -> JSONObject:
        overrides = self._records.budgets.get(agent_id, {})
        now = datetime.now(UTC)
        daily_used = monthly_used = 0.0
        for record in self._records.consumption:
            if record["agent_id"] != agent_id:
                continue
            recorded_at = parse_time(record["recorded_at"])
            if (recorded_at.year, recorded_at.month) == (now.year, now.month):
                monthly_used += float(record["cost_usd"])
                if recorded_at.date() == now.date():
                    daily_used += float(record["cost_usd"])
        simple: JSONObject = {
            "daily_limit": DEFAULT_DAILY_LIMIT_USD,
            "daily_used": round(daily_used, 6),
            "monthly_limit": DEFAULT_MONTHLY_LIMIT_USD,
            "monthly_used": round(monthly_used, 6),
        }
        simple.update({k: v for k, v in overrides.items() if k in simple})
        within_limits = (
            simple["daily_used"] < simple["daily_limit"]
            and simple["monthly_used"] < simple["monthly_limit"]
        )
        healthy = bool(overrides.get("healthy", within_limits))
        if not overrides.get("collective"):
            return {**simple, "healthy": healthy}
        overall = overrides.get("overall_health") or ("healthy" if healthy else "critical")
        total_budget = overrides.get("total_budget_usd", simple["monthly_limit"])
        total_used = overrides.get("total_used_usd", simple["monthly_used"])
        tools = overrides.get("tools") or {
            agent_id: {"budget_usd": total_budget, "used_usd": total_used, "health": overall}
        }
        return {
            "tools": tools,
            "collective": {
                "total_budget_usd": total_budget,
                "total_used_usd": total_used,
                "overall_health": overall,
            },
        }

    def set_budget(self, body: JSONObject) -> JSONObject:
        agent_id = required_text(body, "agent_id")
        overrides = {key: value for key, value in body.items() if key != "agent_id"}
        unknown = sorted(set(overrides) - _BUDGET_OVERRIDES)
        if unknown:
            raise DevHubProblem(422, f"unknown budget fields: {', '.join(unknown)}")
        for key in _NUMERIC_BUDGET_OVERRIDES & set(overrides):
            required_amount(overrides, key)
        for key in ("healthy", "collective"):
            if key in overrides:
                optional_flag(overrides, key, default=False)
        if "tools" in overrides and not isinstance(overrides["tools"], dict):
            raise DevHubProblem(422, "tools must be an object")
        if overrides:
            self._records.budgets[agent_id] = overrides
        else:
            self._records.budgets.pop(agent_id, None)
        self.save()
        return {"agent_id": agent_id, **overrides}

    # -- notifications and agents -------------------------------------------------------------

    def mark_notifications_read(self, body: JSONObject) -> JSONObject:
        ids = body.get("notification_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise DevHubProblem(422, "notification_ids must be a list of non-empty strings")
        already_read = set(self._records.notifications_read)
        for notification_id in ids:
            if notification_id not in already_read:
                self._records.notifications_read.append(notification_id)
                already_read.add(notification_id)
        self.save()
        return {"read": ids}

    def mark_activated(self, agent_id: str) -> JSONObject:
        at = now_iso()
        self._records.activations.append({"agent_id": agent_id, "at": at})
        # An agent the Hub has not seen yet becomes known by acting.
        agent = self._records.agents.setdefault(agent_id, {"id": agent_id, "name": agent_id})
        agent["last_activated_at"] = at
        self.save()
        return {"agent_id": agent_id, "last_activated_at": at}

    def register_agent(self, body: JSONObject) -> JSONObject:
        agent_id = required_text(body, "id")
        name = optional_text(body, "name") or agent_id
        last_activated_at = optional_text(body, "last_activated_at")
        if last_activated_at is not None:
            try:
                last_activated_at = iso(parse_time(last_activated_at))
            except ValueError as e:
                raise DevHubProblem(422, "last_activated_at must be an ISO-8601 time") from e
        agent = {"id": agent_id, "name": name, "last_activated_at": last_activated_at}
        self._records.agents[agent_id] = agent
        self.save()
        return dict(agent)

    def agents(self, *, stale: bool, min_staleness_s: int) -> list[JSONObject]:
        """Registered agents; with ``stale``, those idle for ``min_staleness_s``, oldest first.

        An agent never activated counts as the oldest.
        """
        everyone = [dict(agent) for agent in self._records.agents.values()]
        if not stale:
            return sorted(everyone, key=lambda agent: agent["id"])
        cutoff = datetime.now(UTC) - timedelta(seconds=min_staleness_s)
        idle = [
            agent
            for agent in everyone
            if agent.get("last_activated_at") is None
            or parse_time(agent["last_activated_at"]) <= cutoff
        ]
        return sorted(
            idle,
            key=lambda agent: (
                agent.get("last_activated_at") is not None,
                parse_time(agent["last_activated_at"])
                if agent.get("last_activated_at")
                else cutoff,
                agent["id"],
            ),
        )

    # -- development views --------------------------------------------------------------------

    def snapshot(self) -> JSONObject:
        records = self._records
        return {
            "posts": [dict(post) for post in records.posts],
            "comments": [dict(comment) for comment in records.comments],
            "consumption": [dict(record) for record in records.consumption],
            "notifications_read": list(records.notifications_read),
            "activations": [dict(activation) for activation in records.activations],
            "replays": records.replays,
            "agents": [dict(agent) for agent in records.agents.values()],
            "budgets": {agent_id: dict(b) for agent_id, b in records.budgets.items()},
            "idempotency_keys": sorted(records.idempotency),
        }

    def reset(self) -> None:
        self._records = Records()
        self.save()


def normalize_community(name: str) -> str:
    """``general`` and ``m/general`` name the same community."""
    name = name.strip()
    return name if name.startswith("m/") else f"m/{name}"


def _searchable_text(post: JSONObject) -> str:
    return f"{post.get('title') or ''}\n{post.get('content') or ''}".lower()
