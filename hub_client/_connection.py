"""One Hub connection: the two lower layers of the Hub client (see ``_client``).

``_send_with_retries`` decides whether and when to try again, within the caller's
remaining budget; ``_send_once`` makes one HTTP request within a time limit and sorts
its answer into JSON, an outage worth retrying, or a rejection (``HubRejected``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Self

import anyio
import httpx2

from hub_client._exceptions import (
    HubAuthError,
    HubNotFound,
    HubRejected,
    HubUnavailable,
)
from hub_client.retry_rules import Backoff, Failure, Jitter, classify_status, retry_after_s

_API_PREFIX = "/api/v1"
_BACKOFF = Backoff(first_s=0.25, max_s=8.0, jitter=Jitter.HALF)
# A Retry-After longer than this means a real outage: give up and let the caller queue the write.
_MAX_RETRY_AFTER_S = 30.0
_HUB_MESSAGE_MAX_CHARS = 300


class _RetryableAnswer(Exception):
    """One attempt failed in a way that another attempt may fix."""

    def __init__(self, reason: str, *, status: int | None, retry_after_s: float | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s


class HubConnection:
    """A Hub base URL, its key and one HTTP client; ``HubClient`` adds the API on top.

    ``timeout_s`` bounds each attempt; a call's own ``timeout_s`` (the caller's
    remaining budget) bounds the whole call, retries and waits included.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 15.0,
        max_retries: int = 3,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        root = base_url.rstrip("/")
        if not root.endswith(_API_PREFIX):
            root += _API_PREFIX
        headers = {"Accept": "application/json", "User-Agent": "hub-agent-worker"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._api_key = api_key or ""
        self._timeout_s = timeout_s
        self._max_retries = max(0, max_retries)
        self._http = httpx2.AsyncClient(
            base_url=root,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            trust_env=False,
        )
        # Replaceable so tests can observe backoff without waiting for it.
        self._sleep: Callable[[float], Awaitable[None]] = anyio.sleep

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={str(self._http.base_url)!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send_with_retries(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
        idempotency_key: str | None = None,
        naturally_idempotent: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        """Send, retrying only when a repeat cannot create something twice.

        Returns the decoded JSON answer (None when the body is empty).
        """
        label = f"{method} {path}"
        retry_safe = (
            method in ("GET", "HEAD") or idempotency_key is not None or naturally_idempotent
        )
        max_attempts = 1 + (self._max_retries if retry_safe else 0)
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        failure: _RetryableAnswer | None = None
        attempts_made = 0
        while attempts_made < max_attempts:
            remaining_s = self._timeout_s if deadline is None else deadline - time.monotonic()
            if remaining_s <= 0:
                break
            attempts_made += 1
            try:
                payload = await self._send_once(
                    method,
                    path,
                    params=params,
                    json=json,
                    headers=headers,
                    timeout_s=min(self._timeout_s, remaining_s),
                )
            except _RetryableAnswer as retryable:
                failure = retryable
            else:
                return payload
            delay_s = _backoff_delay(attempts_made - 1, failure.retry_after_s)
            if attempts_made >= max_attempts or delay_s is None:
                break
            if deadline is not None and time.monotonic() + delay_s >= deadline:
                break
            await self._sleep(delay_s)
        if failure is None:
            raise HubUnavailable(f"{label}: no time left for the call", method=method, path=path)
        tried = f" (after {attempts_made} attempts)" if attempts_made > 1 else ""
        raise HubUnavailable(
            self._redact(f"{label}: {failure.reason}{tried}"),
            method=method,
            path=path,
            status=failure.status,
        )

    async def _send_once(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None,
        json: Any,
        headers: dict[str, str],
        timeout_s: float,
    ) -> Any:
        """One request; returns the decoded JSON answer (None when the body is empty).

        Raises ``_RetryableAnswer`` for outages, ``HubRejected`` for refusals (``classify_status``).
        """
        try:
            with anyio.fail_after(timeout_s):
                response = await self._http.request(
                    method, path, params=params, json=json, headers=headers, timeout=timeout_s
                )
        except (TimeoutError, httpx2.TimeoutException) as e:
            raise _RetryableAnswer(
                f"timed out after {timeout_s:.1f}s", status=None, retry_after_s=None
            ) from e
        except httpx2.TransportError as e:
            reason = f"connection failed ({type(e).__name__}: {e})"
            raise _RetryableAnswer(reason, status=None, retry_after_s=None) from e
        if response.is_error:
            if classify_status(response.status_code) is Failure.TRANSIENT:
                raise _RetryableAnswer(
                    _status_line(response),
                    status=response.status_code,
                    retry_after_s=retry_after_s(response.headers),
                )
            raise self._rejection(response, method=method, path=path)
        return _decoded(response)

    def _rejection(self, response: httpx2.Response, *, method: str, path: str) -> HubRejected:
        hub_message = self._redact(_hub_message(response))
        message = f"{method} {path}: {_status_line(response)}"
        if hub_message:
            message += f": {hub_message}"
        status = response.status_code
        error_class: type[HubRejected] = HubRejected
        if classify_status(status) is Failure.AUTH:
            error_class = HubAuthError
        elif status == 404:
            error_class = HubNotFound
        return error_class(
            self._redact(message), method=method, path=path, status=status, hub_message=hub_message
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text


def _backoff_delay(attempt: int, retry_after_s: float | None) -> float | None:
    """Seconds to wait before the next attempt, or None when the Hub asks for too long a pause."""
    jittered = _BACKOFF.delay_s(attempt)
    if retry_after_s is None:
        return jittered
    if retry_after_s > _MAX_RETRY_AFTER_S:
        return None
    return max(retry_after_s, jittered)


def _decoded(response: httpx2.Response) -> Any:
    """The JSON answer. Anything else with a 2xx status (a proxy's or load balancer's HTML
    maintenance page, a truncated body) is not the Hub speaking: count it as an outage."""
    if not response.content.strip():
        return None
    try:
        return response.json()
    except ValueError as e:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise _RetryableAnswer(
            f"answer is not JSON ({_status_line(response)}, {kind})",
            status=response.status_code,
            retry_after_s=retry_after_s(response.headers),
        ) from e


def _status_line(response: httpx2.Response) -> str:
    return f"{response.status_code} {response.reason_phrase}".rstrip()


def _hub_message(response: httpx2.Response) -> str:
    """The reason the Hub gave, from ``{"error"|"detail"|"message": ...}`` or the raw text."""
    try:
        payload = response.json()
    except ValueError:
        return _clipped(response.text.strip())
    if isinstance(payload, dict):
        for key in ("error", "detail", "message"):
            reason = payload.get(key)
            if isinstance(reason, dict):
                reason = reason.get("message", reason)
            if reason:
                return _clipped(str(reason))
    return _clipped(str(payload))


def _clipped(text: str) -> str:
    """``text`` within the limit, cut at a space: this client has no redactor (the worker
    masks what it logs or posts, whole), so a cut never halves a word such as a key."""
    if len(text) <= _HUB_MESSAGE_MAX_CHARS:
        return text
    head = text[: _HUB_MESSAGE_MAX_CHARS + 1]
    return head[: head.rfind(" ")].rstrip() if " " in head else ""
