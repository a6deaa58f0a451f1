"""What every devhub endpoint goes through: the bearer check, injected faults, the request
log, error answers as JSON, and idempotent writes (one answer per Idempotency-Key)."""

from __future__ import annotations

import hmac
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hub_client._devhub_records import (
    DevHubProblem,
    JSONObject,
    StoredAnswer,
    optional_amount,
    optional_text,
)
from hub_client._devhub_state import DevHubStore

API = "/api/v1"
DEV = f"{API}/_dev"

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(kw_only=True)
class Fault:
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


class DevHubGuard:
    """The HTTP face of a ``DevHubStore``: auth, injected faults, idempotency, JSON."""

    def __init__(self, store: DevHubStore, *, api_key: str | None, log_requests: bool) -> None:
        self.store = store
        self._expected_authorization = f"Bearer {api_key}".encode() if api_key else None
        self._log_requests = log_requests
        self._faults: list[Fault] = []

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

    def _take_fault(self, method: str, path: str) -> Fault | None:
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
        delay_s = optional_amount(body, "delay_s") or 0.0
        if status is None and delay_s <= 0:
            raise DevHubProblem(422, "a fault needs a status or a delay_s")
        path_prefix = body.get("path_prefix", API)
        if not isinstance(path_prefix, str) or not path_prefix.startswith("/"):
            raise DevHubProblem(422, "path_prefix must be a path starting with /")
        self._faults = [fault for fault in self._faults if fault.remaining > 0]
        self._faults.append(
            Fault(
                status=status,
                remaining=count,
                path_prefix=path_prefix,
                retry_after_s=optional_amount(body, "retry_after"),
                delay_s=delay_s,
                method=optional_text(body, "method"),
                body=optional_text(body, "body"),
                content_type=optional_text(body, "content_type") or "application/json",
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
        answer = StoredAnswer(status=status, body=create(await json_body(request)))
        if key:
            self.store.remember(key, signature, answer)
        return JSONResponse(answer.body, status_code=answer.status)


async def json_body(request: Request) -> JSONObject:
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
