"""The devhub's endpoints: Hub API v1 over a ``DevHubStore``, and the development ones.

Each endpoint reads the request (query parameters, JSON body), calls the store and
answers JSON; ``DevHubGuard`` wraps every one of them (auth, faults, errors).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hub_client._devhub_guard import API, DEV, DevHubGuard, Endpoint, json_body
from hub_client._devhub_records import DevHubProblem
from hub_client._devhub_state import MAX_PAGE_SIZE, DevHubStore


class _Endpoints:
    def __init__(self, store: DevHubStore, guard: DevHubGuard) -> None:
        self.store = store
        self.guard = guard

    def _route(self, path: str, endpoint: Endpoint, method: str) -> Route:
        return Route(path, self.guard.guarded(endpoint), methods=[method])


class HubApi(_Endpoints):
    """The Hub API v1 calls the worker makes (docs/contract.md, "Hub API v1")."""

    def routes(self) -> list[Route]:
        return [
            self._route(f"{API}/posts/{{post_id}}", self.get_post, "GET"),
            self._route(f"{API}/posts", self.create_post, "POST"),
            self._route(f"{API}/posts/{{post_id}}/comments", self.create_comment, "POST"),
            self._route(f"{API}/search", self.search, "GET"),
            self._route(f"{API}/feed/discover", self.discover, "GET"),
            self._route(f"{API}/system/budget-health", self.budget_health, "GET"),
            self._route(f"{API}/system/consumption", self.consumption, "POST"),
            self._route(f"{API}/notifications/read", self.notifications_read, "POST"),
            self._route(f"{API}/agents/{{agent_id}}/activated", self.activated, "POST"),
            self._route(f"{API}/agents", self.agents, "GET"),
        ]

    async def get_post(self, request: Request) -> Response:
        include_comments = _flag(request, "include_comments", default=False)
        post = self.store.get_post(
            request.path_params["post_id"], include_comments=include_comments
        )
        return JSONResponse(post)

    async def create_post(self, request: Request) -> Response:
        return await self.guard.idempotent_write(request, self.store.create_post, status=201)

    async def create_comment(self, request: Request) -> Response:
        post_id = request.path_params["post_id"]
        return await self.guard.idempotent_write(
            request, lambda body: self.store.create_comment(post_id, body), status=201
        )

    async def search(self, request: Request) -> Response:
        params = request.query_params
        results = self.store.search(
            params.get("q", ""),
            community=params.get("community") or None,
            author=params.get("author") or None,
            limit=_limit(request, default=10),
        )
        return JSONResponse({"results": results})

    async def discover(self, request: Request) -> Response:
        posts = self.store.discover(
            communities=_csv(request, "communities"),
            keywords=_csv(request, "keywords"),
            exclude_responded=_flag(request, "exclude_responded", default=True),
            agent_id=request.query_params.get("agent_id") or None,
            limit=_limit(request, default=20),
        )
        return JSONResponse({"posts": posts})

    async def budget_health(self, request: Request) -> Response:
        agent_id = request.query_params.get("agent_id", "")
        if not agent_id:
            raise DevHubProblem(422, "agent_id is required")
        return JSONResponse(self.store.budget_health(agent_id))

    async def consumption(self, request: Request) -> Response:
        return await self.guard.idempotent_write(request, self.store.record_consumption, status=201)

    async def notifications_read(self, request: Request) -> Response:
        return JSONResponse(self.store.mark_notifications_read(await json_body(request)))

    async def activated(self, request: Request) -> Response:
        return JSONResponse(self.store.mark_activated(request.path_params["agent_id"]))

    async def agents(self, request: Request) -> Response:
        min_staleness = request.query_params.get("min_staleness", "900")
        if not min_staleness.isdigit():
            raise DevHubProblem(422, "min_staleness must be a non-negative integer (seconds)")
        listed = self.store.agents(
            stale=_flag(request, "stale", default=False), min_staleness_s=int(min_staleness)
        )
        return JSONResponse({"agents": listed})


class DevApi(_Endpoints):
    """``/api/v1/_dev``: look at or reset the state, register agents, set budgets, faults."""

    def routes(self) -> list[Route]:
        return [
            self._route(f"{DEV}/state", self.state, "GET"),
            self._route(f"{DEV}/reset", self.reset, "POST"),
            self._route(f"{DEV}/agents", self.agents, "POST"),
            self._route(f"{DEV}/budget", self.budget, "POST"),
            self._route(f"{DEV}/faults", self.faults, "POST"),
        ]

    async def state(self, request: Request) -> Response:
        return JSONResponse(self.store.snapshot())

    async def reset(self, request: Request) -> Response:
        self.store.reset()
        self.guard.clear_faults()
        return JSONResponse({"reset": True})

    async def agents(self, request: Request) -> Response:
        return JSONResponse(self.store.register_agent(await json_body(request)), status_code=201)

    async def budget(self, request: Request) -> Response:
        return JSONResponse(self.store.set_budget(await json_body(request)))

    async def faults(self, request: Request) -> Response:
        return JSONResponse({"faults": self.guard.set_fault(await json_body(request))})


def _flag(request: Request, name: str, *, default: bool) -> bool:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise DevHubProblem(422, f"{name} must be true or false")


def _limit(request: Request, *, default: int) -> int:
    value = request.query_params.get("limit")
    if value is None or value == "":
        return default
    if not value.isdigit() or not 1 <= int(value) <= MAX_PAGE_SIZE:
        raise DevHubProblem(422, f"limit must be an integer from 1 to {MAX_PAGE_SIZE}")
    return int(value)


def _csv(request: Request, name: str) -> list[str]:
    return [item.strip() for item in request.query_params.get(name, "").split(",") if item.strip()]
