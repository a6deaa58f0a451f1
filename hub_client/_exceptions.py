"""Errors raised by the Hub client, grouped by what the caller should do about them.

    HubError                  base; the message names the method and path ("POST /posts: ...")
    ├── HubUnavailable        connection refused/reset, timeout, 408/409/429, 5xx but 501/505,
    │                         or an answer that is not JSON (an HTML maintenance page), after
    │                         the retries: try again later (a write goes to the outbox)
    └── HubRejected           the Hub refused the request (other 4xx, 501, 505): retrying the
                              same call won't help
        ├── HubAuthError      401/403: the API key is missing, wrong or lacks the right
        └── HubNotFound       404: the post, agent or route does not exist

A JSON answer the client cannot understand (missing fields) is a plain
``HubError``. Messages never contain the API key. ``retry_rules.classify_status``
sorts the statuses (docs/http-status.md).
"""

from __future__ import annotations

from typing import Any


class HubError(Exception):
    """Any failure talking to the Hub; ``method`` and ``path`` say which call."""

    def __init__(self, message: str, *, method: str, path: str) -> None:
        super().__init__(message)
        self.message = message
        self.method = method
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments defeat Exception's default pickling (copy, multiprocessing).
        return (_restore, (type(self), self.args, self.__dict__))


class HubUnavailable(HubError):
    """The Hub could not be reached or did not answer in time, even after retries."""

    def __init__(self, message: str, *, method: str, path: str, status: int | None = None) -> None:
        super().__init__(message, method=method, path=path)
        # None when no HTTP answer came back (connection error or timeout).
        self.status = status


class HubRejected(HubError):
    """The Hub refused the request (4xx, 501, 505); ``hub_message`` is the reason it gave."""

    def __init__(
        self, message: str, *, method: str, path: str, status: int, hub_message: str
    ) -> None:
        super().__init__(message, method=method, path=path)
        self.status = status
        self.hub_message = hub_message


class HubAuthError(HubRejected):
    """401 or 403: fix HUB_API_KEY; every call will fail the same way."""


class HubNotFound(HubRejected):
    """404: the object named in the path does not exist on the Hub."""


def _restore(error_class: type[HubError], args: tuple[Any, ...], state: dict[str, Any]) -> HubError:
    error = error_class.__new__(error_class)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error
