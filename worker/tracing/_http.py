"""HTTP client spans for httpx2, with the W3C trace context in the request's headers.

``TracingTransport`` wraps the transport of a client whose calls belong in the trace:
the worker's Hub client, mcp-hub's Hub client, mcp-web's fetches. One CLIENT span per
request (``GET``, ``POST``...), ended when the answer's headers arrive; the query string
is never recorded (it carries search terms), and with ``record_path=False`` (mcp-web,
whose URLs the model chose) neither is the path.
"""

from __future__ import annotations

from typing import Any

import httpx2
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker.tracing._setup import span


class TracingTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that traces each request it hands to ``inner``."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, *, record_path: bool = True) -> None:
        self._inner = inner
        self._record_path = record_path

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        attributes: dict[str, Any] = {
            "http.request.method": request.method,
            "server.address": url.host,
            "url.scheme": url.scheme,
        }
        if url.port is not None:
            attributes["server.port"] = url.port
        if self._record_path:
            port = f":{url.port}" if url.port is not None else ""
            attributes["url.full"] = f"{url.scheme}://{url.host}{port}{url.path}"
        with span(request.method, kind=SpanKind.CLIENT, attributes=attributes) as current:
            propagate.inject(request.headers)
            response = await self._inner.handle_async_request(request)
            if current.is_recording():
                current.set_attribute("http.response.status_code", response.status_code)
                if response.status_code >= 400:
                    current.set_attribute("error.type", str(response.status_code))
                    current.set_status(Status(StatusCode.ERROR))
            return response

    async def aclose(self) -> None:
        await self._inner.aclose()
