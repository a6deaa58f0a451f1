"""The HTTP side: OpenAI and Anthropic routes, the ``/_scripted`` control API, and
``ScriptedEndpoint`` to run it in a background thread of the current process."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.lowlevel
import uvicorn
from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from worker.dev.scripted_endpoint._conversation import (
    Api,
    BadModelRequest,
    Conversation,
    anthropic_conversation,
    openai_conversation,
)
from worker.dev.scripted_endpoint._demo_agent import demo_agent_turn
from worker.dev.scripted_endpoint._scenarios import (
    AUTH_HEADERS,
    NO_TURN_LEFT,
    Draw,
    EndpointSettings,
    ScenarioStore,
    ScriptedTurn,
    StormSettings,
)
from worker.dev.scripted_endpoint._wire import (
    Answer,
    answer_for,
    anthropic_events,
    anthropic_message,
    error_body,
    openai_chunks,
    openai_completion,
    sse_data,
    sse_event,
)

_READY_TIMEOUT_S = 10.0
# Open SSE streams must not hold a shutdown for long.
_GRACEFUL_SHUTDOWN_S = 2
_TURNS = TypeAdapter(list[ScriptedTurn])

ConversationParser = Callable[..., Conversation]
_PARSERS: dict[Api, ConversationParser] = {
    "openai": openai_conversation,
    "anthropic": anthropic_conversation,
}


def create_app(store: ScenarioStore) -> Starlette:
    """The endpoint as an ASGI app over ``store`` (for a server of your own)."""

    async def chat_completions(request: Request) -> Response:
        return await _model_call(request, store, "openai")

    async def messages(request: Request) -> Response:
        return await _model_call(request, store, "anthropic")

    async def count_tokens(request: Request) -> Response:
        return JSONResponse({"input_tokens": max(1, len(await request.body()) // 4)})

    async def models(request: Request) -> Response:
        return JSONResponse(_model_list(store.scenario_names()))

    async def set_scenario(request: Request) -> Response:
        body = await _control_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            return _control_error("'name' must be a non-empty string")
        try:
            turns = _TURNS.validate_python(body.get("turns", []))
        except ValidationError as exc:
            return _control_error(_validation_message(exc))
        store.set_scenario(name, turns)
        return JSONResponse({"name": name, "turns": len(turns)})

    async def reset(request: Request) -> Response:
        store.reset()
        return JSONResponse({"reset": True})

    async def recorded(request: Request) -> Response:
        scenario = request.query_params.get("scenario") or None
        return JSONResponse({"requests": store.requests(scenario)})

    async def configure(request: Request) -> Response:
        try:
            settings = EndpointSettings.model_validate(await _control_body(request))
        except ValidationError as exc:
            return _control_error(_validation_message(exc))
        store.configure(settings)
        return JSONResponse(store.stats())

    async def stats(request: Request) -> Response:
        return JSONResponse(store.stats())

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/_scripted/scenarios", set_scenario, methods=["POST"]),
        Route("/_scripted/reset", reset, methods=["POST"]),
        Route("/_scripted/requests", recorded, methods=["GET"]),
        Route("/_scripted/config", configure, methods=["POST"]),
        Route("/_scripted/stats", stats, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


async def _model_call(request: Request, store: ScenarioStore, api: Api) -> Response:
    """Read the request, take its scenario's next answer, record it, wait, answer."""
    record = _request_record(request, api)
    try:
        conversation = _conversation(api, await request.body(), record)
    except BadModelRequest as exc:
        store.record(record | {"scenario": "", "answer": "rejected", "status": 400})
        return JSONResponse(error_body(api, 400, {"message": str(exc)}), 400)

    with store.in_flight():
        draw = store.draw(store.scenario_for(conversation.texts(), conversation.model))
        turn = _resolved_turn(draw, conversation)
        status = draw.storm.status if draw.storm is not None else turn.http_status
        store.record(
            record | {"scenario": draw.scenario, "answer": str(draw.kind), "status": status}
        )
        if draw.storm is not None:
            return _storm_answer(api, draw.storm)
        await anyio.sleep(draw.latency_s + turn.delay_s)
        if turn.is_error:
            return JSONResponse(error_body(api, status, turn.error), status, headers=turn.headers)
        answer = answer_for(turn, conversation)
        if not conversation.stream:
            whole = openai_completion(answer) if api == "openai" else anthropic_message(answer)
            return JSONResponse(whole, headers=turn.headers)

    return StreamingResponse(
        _streamed(_sse_frames(api, answer, conversation), store),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", **turn.headers},
    )


def _conversation(api: Api, raw: bytes, record: dict[str, Any]) -> Conversation:
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError:
        raise BadModelRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadModelRequest("the body must be a JSON object")
    record["body"] = body
    return _PARSERS[api](body, request_chars=len(raw))


def _storm_answer(api: Api, storm: StormSettings) -> Response:
    headers = {}
    if storm.retry_after_s is not None:
        headers["retry-after"] = f"{storm.retry_after_s:g}"
    return JSONResponse(error_body(api, storm.status, None), storm.status, headers=headers)


def _sse_frames(api: Api, answer: Answer, conversation: Conversation) -> list[bytes]:
    if api == "anthropic":
        return [sse_event(name, data) for name, data in anthropic_events(answer)]
    chunks = openai_chunks(answer, include_usage=conversation.include_usage)
    return [*(sse_data(chunk) for chunk in chunks), sse_data("[DONE]")]


def _resolved_turn(draw: Draw, conversation: Conversation) -> ScriptedTurn:
    turn = draw.turn or NO_TURN_LEFT
    if turn.dynamic == "demo-agent":
        return demo_agent_turn(conversation)
    return turn


async def _streamed(frames: Sequence[bytes], store: ScenarioStore) -> AsyncIterator[bytes]:
    with store.in_flight():
        for frame in frames:
            yield frame
            # Let each event leave as its own write, as a real token stream does.
            await anyio.lowlevel.checkpoint()


def _request_record(request: Request, api: Api) -> dict[str, Any]:
    headers: dict[str, str] = {}
    auth_lengths: dict[str, int] = {}
    for name, value in request.headers.items():
        if name.lower() in AUTH_HEADERS:
            auth_lengths[name.lower()] = len(value)
        else:
            headers[name.lower()] = value
    return {
        "api": api,
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "headers": headers,
        "auth_present": bool(auth_lengths),
        "auth_length": next(iter(auth_lengths.values()), 0),
        "auth_headers": auth_lengths,
        "body": None,
        "received_at": time.time(),
    }


def _model_list(names: Iterable[str]) -> dict[str, Any]:
    # One list both SDKs read: OpenAI's fields and Anthropic's side by side.
    entries = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "scripted-endpoint",
            "type": "model",
            "display_name": f"Scripted scenario {name}",
            "created_at": "2026-01-01T00:00:00Z",
        }
        for name in names
    ]
    return {
        "object": "list",
        "data": entries,
        "has_more": False,
        "first_id": entries[0]["id"] if entries else None,
        "last_id": entries[-1]["id"] if entries else None,
    }


async def _control_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise HTTPException(422, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(422, "the body must be a JSON object")
    return body


def _control_error(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, 422)


def _validation_message(exc: ValidationError) -> str:
    problems = exc.errors(include_url=False, include_input=False)
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in problems
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return JSONResponse({"error": f"{request.method} {request.url.path}: {detail}"}, status)


class ScriptedEndpoint:
    """The endpoint served by uvicorn in a background thread of this process.

    Use it as a context manager, point an SDK at ``openai_base_url`` or
    ``anthropic_base_url``, and script it with ``set_scenario``. For a worker in
    another process, run ``python -m worker.dev.scripted_endpoint`` instead.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        scenarios: Mapping[str, Sequence[ScriptedTurn | Mapping[str, Any]]] | None = None,
        default_turn: ScriptedTurn | Mapping[str, Any] | None = None,
    ) -> None:
        self._host = host
        self._requested_port = port
        self.store = ScenarioStore(
            scenarios={name: _turns(turns) for name, turns in (scenarios or {}).items()},
            latency_s=latency_s,
            default_turn=_turn(default_turn) if default_turn is not None else NO_TURN_LEFT,
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the scripted endpoint is not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self._host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """What ``OPENAI_BASE_URL`` / ``AsyncOpenAI(base_url=...)`` take (ends in ``/v1``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` / ``AsyncAnthropic(base_url=...)`` take: the SDK
        appends ``/v1/messages`` itself."""
        return self.url

    def start(self) -> Self:
        if self._thread is not None:
            return self
        listener = bind_listener(self._host, self._requested_port)
        self._port = int(listener.getsockname()[1])
        self._server = uvicorn.Server(server_config(create_app(self.store), self._host))
        server = self._server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [listener]}, name="scripted-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"scripted endpoint on port {self._port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=_GRACEFUL_SHUTDOWN_S + 5)
        self._server = None
        self._thread = None

    def set_scenario(self, name: str, turns: Sequence[ScriptedTurn | Mapping[str, Any]]) -> None:
        """Replace scenario ``name`` with ``turns`` (dicts in the wire format, or ScriptedTurn)."""
        self.store.set_scenario(name, _turns(turns))

    def configure(self, **settings: Any) -> None:
        """Same fields as ``POST /_scripted/config``: ``latency_s``, ``storm``, ``default_turn``."""
        self.store.configure(EndpointSettings.model_validate(settings))

    def requests(self, scenario: str | None = None) -> list[dict[str, Any]]:
        return self.store.requests(scenario)

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def reset(self) -> None:
        self.store.reset()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket bound before uvicorn starts, so port 0 yields a known free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio disables Nagle only on sockets that say so, and
    # with Nagle every answer waited ~40 ms for the client's delayed ACK.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    return listener


def server_config(app: Starlette, host: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        log_config=None,  # leave the host process's logging alone
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
    )


def _turn(turn: ScriptedTurn | Mapping[str, Any]) -> ScriptedTurn:
    return turn if isinstance(turn, ScriptedTurn) else ScriptedTurn.model_validate(turn)


def _turns(turns: Sequence[ScriptedTurn | Mapping[str, Any]]) -> list[ScriptedTurn]:
    return [_turn(turn) for turn in turns]
