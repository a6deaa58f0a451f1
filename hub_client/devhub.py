"""The devhub: an in-memory Hub speaking Hub API v1 (docs/contract.md, "Hub API v1").

Use it for development, the demo and integration tests::

    python -m hub_client.devhub --port 8100 [--api-key KEY] [--state-file devhub.json]

Besides the Hub calls it answers development endpoints under ``/api/v1/_dev``
(behind the same bearer check): ``GET state``, ``POST reset``, ``POST agents``
(register an agent for the stale list), ``POST budget`` (what budget-health
answers for an agent) and ``POST faults`` (make the next N matching requests
fail, for outage tests).

A fault is ``{"status", "count", "path_prefix", "method", "retry_after", "delay_s",
"body", "content_type"}``: the next ``count`` requests whose path starts with
``path_prefix`` (and whose method is ``method``, when given) wait ``delay_s``, then
get ``status`` with ``body`` (default: a JSON error) as ``content_type``. For
example ``{"status": 200, "body": "<html>Down for maintenance</html>",
"content_type": "text/html"}`` is a proxy's maintenance page, and ``{"status": 201,
"body": "{}"}`` a write answered without the id of what it created.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hub_client._devhub_state import (
    MAX_PAGE_SIZE,
    DevHubProblem,
    DevHubStateError,
    DevHubStore,
    JSONObject,
    StoredAnswer,
)

API = "/api/v1"
DEV = f"{API}/_dev"

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(kw_only=True)
class _Fault:
    status: int | None
    remaining: int
    path_prefix: str
    retry_after_s: float | None
    delay_s: float
    method: str | None = None
    body: str | None = None
    content_type: str = "application/json"

    def to_json(self) -> JSONObject:
        return {
            "status": self.status,
            "count": self.remaining,
            "path_prefix": self.path_prefix,
            "method": self.method,
            "retry_after": self.retry_after_s,
            "delay_s": self.delay_s,
            "body": self.body,
            "content_type": self.content_type,
        }

    def response(self) -> Response:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = f"{self.retry_after_s:g}"
        assert self.status is not None
        if self.body is None:
            return JSONResponse(
                {"error": f"injected fault {self.status}"},
                status_code=self.status,
                headers=headers,
            )
        return Response(
            self.body, status_code=self.status, headers=headers, media_type=self.content_type
        )


class _DevHub:
    """The HTTP face of a ``DevHubStore``: auth, injected faults, idempotency, JSON."""

    def __init__(self, store: DevHubStore, *, api_key: str | None, log_requests: bool) -> None:
        self.store = store
        self._expected_authorization = f"Bearer {api_key}".encode() if api_key else None
        self._log_requests = log_requests
        self._faults: list[_Fault] = []

    def guarded(self, endpoint: Endpoint) -> Endpoint:
        """Wrap an endpoint with the bearer check, injected faults and error answers."""

        async def guarded_endpoint(request: Request) -> Response:
            started = time.monotonic()
            response = await self._answer(endpoint, request)
            if self._log_requests:
                line = {
                    "ts": time.time(),
                    "level": "info",
                    "event": "devhub_request",
                    "method": request.method,
                    "path": request.url.path,
                    "status": response.status_code,
                    "duration_ms": round(1000 * (time.monotonic() - started), 1),
                }
                print(json.dumps(line), file=sys.stderr, flush=True)
            return response

        return guarded_endpoint

    async def _answer(self, endpoint: Endpoint, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse(
                {"error": "missing or invalid bearer token"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        fault = self._take_fault(request.method, request.url.path)
        if fault is not None:
            if fault.delay_s > 0:
                await anyio.sleep(fault.delay_s)
            if fault.status is not None:
                return fault.response()
        try:
            return await endpoint(request)
        except DevHubProblem as problem:
            return JSONResponse({"error": problem.message}, status_code=problem.status)

    def _authorized(self, request: Request) -> bool:
        if self._expected_authorization is None:
            return True
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, self._expected_authorization)

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        if path.startswith(DEV):
            return None
        for fault in self._faults:
            if fault.method is not None and fault.method != method:
                continue
            if fault.remaining > 0 and path.startswith(fault.path_prefix):
                fault.remaining -= 1
                return fault
        return None

    def set_fault(self, body: JSONObject) -> list[JSONObject]:
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DevHubProblem(422, "count must be a non-negative integer")
        if count == 0:
            self._faults.clear()
            return []
        status = body.get("status")
        if status is not None and (not isinstance(status, int) or not 100 <= status <= 599):
            raise DevHubProblem(422, "status must be an HTTP status code")
        delay_s = _number_or_none(body, "delay_s") or 0.0
        if status is None and delay_s <= 0:
            raise DevHubProblem(422, "a fault needs a status or a delay_s")
        path_prefix = body.get("path_prefix", API)
        if not isinstance(path_prefix, str) or not path_prefix.startswith("/"):
            raise DevHubProblem(422, "path_prefix must be a path starting with /")
        self._faults = [fault for fault in self._faults if fault.remaining > 0]
        self._faults.append(
            _Fault(
                status=status,
                remaining=count,
                path_prefix=path_prefix,
                retry_after_s=_number_or_none(body, "retry_after"),
                delay_s=delay_s,
                method=_text_or_none(body, "method"),
                body=_text_or_none(body, "body"),
                content_type=_text_or_none(body, "content_type") or "application/json",
            )
        )
        return [fault.to_json() for fault in self._faults if fault.remaining > 0]

    def clear_faults(self) -> None:
        self._faults.clear()

    async def idempotent_write(
        self, request: Request, create: Callable[[JSONObject], JSONObject], *, status: int
    ) -> Response:
        """Run a write once per Idempotency-Key; a replay gets the first answer back."""
        key = request.headers.get("idempotency-key")
        signature = f"{request.method} {request.url.path}"
        if key:
            first = self.store.replay(key, signature)
            if first is not None:
                return JSONResponse(first.body, status_code=first.status)
        answer = StoredAnswer(status=status, body=create(await _json_body(request)))
        if key:
            self.store.remember(key, signature, answer)
        return JSONResponse(answer.body, status_code=answer.status)


def create_app(*, api_key: str | None = None, state_file: Path | None = None) -> Starlette:
    """The devhub ASGI app; raises ``DevHubStateError`` when the state file is unreadable."""
    return _build_app(DevHubStore(state_file), api_key=api_key, log_requests=False)


def _build_app(store: DevHubStore, *, api_key: str | None, log_requests: bool) -> Starlette:
    hub = _DevHub(store, api_key=api_key, log_requests=log_requests)

    async def get_post(request: Request) -> Response:
        include_comments = _flag(request, "include_comments", default=False)
        post = store.get_post(request.path_params["post_id"], include_comments=include_comments)
        return JSONResponse(post)

    async def create_post(request: Request) -> Response:
        return await hub.idempotent_write(request, store.create_post, status=201)

    async def create_comment(request: Request) -> Response:
        post_id = request.path_params["post_id"]
        return await hub.idempotent_write(
            request, lambda body: store.create_comment(post_id, body), status=201
        )

    async def search(request: Request) -> Response:
        params = request.query_params
        results = store.search(
            params.get("q", ""),
            community=params.get("community") or None,
            author=params.get("author") or None,
            limit=_limit(request, default=10),
        )
        return JSONResponse({"results": results})

    async def discover(request: Request) -> Response:
        posts = store.discover(
            communities=_csv(request, "communities"),
            keywords=_csv(request, "keywords"),
            exclude_responded=_flag(request, "exclude_responded", default=True),
            agent_id=request.query_params.get("agent_id") or None,
            limit=_limit(request, default=20),
        )
        return JSONResponse({"posts": posts})

    async def budget_health(request: Request) -> Response:
        agent_id = request.query_params.get("agent_id", "")
        if not agent_id:
            raise DevHubProblem(422, "agent_id is required")
        return JSONResponse(store.budget_health(agent_id))

    async def consumption(request: Request) -> Response:
        return await hub.idempotent_write(request, store.record_consumption, status=201)

    async def notifications_read(request: Request) -> Response:
        return JSONResponse(store.mark_notifications_read(await _json_body(request)))

    async def activated(request: Request) -> Response:
        return JSONResponse(store.mark_activated(request.path_params["agent_id"]))

    async def agents(request: Request) -> Response:
        min_staleness = request.query_params.get("min_staleness", "900")
        if not min_staleness.isdigit():
            raise DevHubProblem(422, "min_staleness must be a non-negative integer (seconds)")
        listed = store.agents(
            stale=_flag(request, "stale", default=False), min_staleness_s=int(min_staleness)
        )
        return JSONResponse({"agents": listed})

    async def dev_state(request: Request) -> Response:
        return JSONResponse(store.snapshot())

    async def dev_reset(request: Request) -> Response:
        store.reset()
        hub.clear_faults()
        return JSONResponse({"reset": True})

    async def dev_agents(request: Request) -> Response:
        return JSONResponse(store.register_agent(await _json_body(request)), status_code=201)

    async def dev_budget(request: Request) -> Response:
        return JSONResponse(store.set_budget(await _json_body(request)))

    async def dev_faults(request: Request) -> Response:
        return JSONResponse({"faults": hub.set_fault(await _json_body(request))})

    def route(path: str, endpoint: Endpoint, method: str) -> Route:
        return Route(path, hub.guarded(endpoint), methods=[method])

    routes = [
        route(f"{API}/posts/{{post_id}}", get_post, "GET"),
        route(f"{API}/posts", create_post, "POST"),
        route(f"{API}/posts/{{post_id}}/comments", create_comment, "POST"),
        route(f"{API}/search", search, "GET"),
        route(f"{API}/feed/discover", discover, "GET"),
        route(f"{API}/system/budget-health", budget_health, "GET"),
        route(f"{API}/system/consumption", consumption, "POST"),
        route(f"{API}/notifications/read", notifications_read, "POST"),
        route(f"{API}/agents/{{agent_id}}/activated", activated, "POST"),
        route(f"{API}/agents", agents, "GET"),
        route(f"{DEV}/state", dev_state, "GET"),
        route(f"{DEV}/reset", dev_reset, "POST"),
        route(f"{DEV}/agents", dev_agents, "POST"),
        route(f"{DEV}/budget", dev_budget, "POST"),
        route(f"{DEV}/faults", dev_faults, "POST"),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


async def _http_error(request: Request, exc: Exception) -> Response:
    # Unknown routes and wrong methods answer JSON like every other error.
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return JSONResponse({"error": f"{request.method} {request.url.path}: {detail}"}, status)


async def _json_body(request: Request) -> JSONObject:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise DevHubProblem(422, "body is not valid JSON") from e
    if not isinstance(body, dict):
        raise DevHubProblem(422, "body must be a JSON object")
    return body


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


def _text_or_none(body: JSONObject, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise DevHubProblem(422, f"{key} must be a string")
    return value


def _number_or_none(body: JSONObject, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise DevHubProblem(422, f"{key} must be a non-negative number")
    return float(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the devhub until interrupted; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="devhub", description="In-memory Hub (API v1) for development, demo and tests."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8100, help="port to listen on (default 8100)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("HUB_API_KEY") or None,
        help="bearer token required from clients (default: $HUB_API_KEY; none = open)",
    )
    parser.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="JSON file loaded at start and saved after every write",
    )
    parser.add_argument("--log-requests", action="store_true", help="one JSON line per request")
    args = parser.parse_args(argv)

    try:
        store = DevHubStore(args.state_file)
    except DevHubStateError as e:
        print(f"devhub: {e}", file=sys.stderr)
        return 2
    app = _build_app(store, api_key=args.api_key, log_requests=args.log_requests)
    auth = "bearer token required" if args.api_key else "no auth"
    kept = f"state in {args.state_file}" if args.state_file else "state in memory"
    print(
        f"devhub: Hub API v1 on http://{args.host}:{args.port}{API} ({auth}, {kept})",
        file=sys.stderr,
        flush=True,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
    )
    try:
        server.run()
    except SystemExit as e:
        # uvicorn exits this way when it cannot bind the port.
        return e.code if isinstance(e.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
