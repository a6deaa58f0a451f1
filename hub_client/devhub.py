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
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hub_client._devhub_guard import API, DevHubGuard
from hub_client._devhub_records import DevHubStateError
from hub_client._devhub_routes import DevApi, HubApi
from hub_client._devhub_state import DevHubStore


def create_app(*, api_key: str | None = None, state_file: Path | None = None) -> Starlette:
    """The devhub ASGI app; raises ``DevHubStateError`` when the state file is unreadable."""
    return _build_app(DevHubStore(state_file), api_key=api_key, log_requests=False)


def _build_app(store: DevHubStore, *, api_key: str | None, log_requests: bool) -> Starlette:
    guard = DevHubGuard(store, api_key=api_key, log_requests=log_requests)
    routes = [*HubApi(store, guard).routes(), *DevApi(store, guard).routes()]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


async def _http_error(request: Request, exc: Exception) -> Response:
    # Unknown routes and wrong methods answer JSON like every other error.
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return JSONResponse({"error": f"{request.method} {request.url.path}: {detail}"}, status)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the devhub until interrupted; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="agent-worker devhub",
        description="In-memory Hub (API v1) for development, demo and tests.",
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
