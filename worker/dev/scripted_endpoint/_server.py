"""The HTTP side: OpenAI and Anthropic routes and the ``/_scripted`` control API
(``_runner`` serves them)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
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
from worker.dev.scripted_endpoint._embeddings import SCENARIO as EMBEDDINGS_SCENARIO
from worker.dev.scripted_endpoint._embeddings import embeddings_answer
from worker.dev.scripted_endpoint._scenarios import (
    AUTH_HEADERS,
    NO_TURN_LEFT,
    Draw,
    EndpointSettings,
    ScenarioStore,
    ScriptedTurn,
    StormSettings,
    no_turn_left,
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

_TURNS = TypeAdapter(list[ScriptedTurn])

ConversationParser = Callable[..., Conversation]
_PARSERS: dict[Api, ConversationParser] = {
    "openai": openai_conversation,
    "anthropic": anthropic_conversation,
}


def create_app(store: ScenarioStore) -> Starlette:
    """The endpoint as an ASGI app over ``store`` (for a server of your own): the routes a
    provider SDK calls, then the ``/_scripted`` control API a test or a guide calls."""
    routes = [*_ProviderRoutes(store).routes(), *_ControlRoutes(store).routes()]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


class _ProviderRoutes:
    """What the SDKs call: OpenAI Chat Completions, embeddings and models (with and
    without ``/v1``), Anthropic Messages and its token count."""

    def __init__(self, store: ScenarioStore) -> None:
        self._store = store

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    async def chat_completions(self, request: Request) -> Response:
        return await _model_call(request, self._store, "openai")

    async def messages(self, request: Request) -> Response:
        return await _model_call(request, self._store, "anthropic")

    async def embeddings(self, request: Request) -> Response:
        return await _embeddings_call(request, self._store)

    async def count_tokens(self, request: Request) -> Response:
        return JSONResponse({"input_tokens": max(1, len(await request.body()) // 4)})

    async def models(self, request: Request) -> Response:
        return JSONResponse(_model_list(self._store.scenario_names()))


class _ControlRoutes:
    """``/_scripted``: set a scenario's turns, reset, read the recorded requests, configure
    the endpoint (its faults and limits) and read its counters."""

    def __init__(self, store: ScenarioStore) -> None:
        self._store = store

    def routes(self) -> list[Route]:
        return [
            Route("/_scripted/scenarios", self.set_scenario, methods=["POST"]),
            Route("/_scripted/reset", self.reset, methods=["POST"]),
            Route("/_scripted/requests", self.recorded, methods=["GET"]),
            Route("/_scripted/config", self.configure, methods=["POST"]),
            Route("/_scripted/stats", self.stats, methods=["GET"]),
        ]

    async def set_scenario(self, request: Request) -> Response:
        body = await _control_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            return _control_error("'name' must be a non-empty string")
        try:
            turns = _TURNS.validate_python(body.get("turns", []))
        except ValidationError as exc:
            return _control_error(_validation_message(exc))
        self._store.set_scenario(name, turns)
        return JSONResponse({"name": name, "turns": len(turns)})

    async def reset(self, request: Request) -> Response:
        self._store.reset()
        return JSONResponse({"reset": True})

    async def recorded(self, request: Request) -> Response:
        scenario = request.query_params.get("scenario") or None
        return JSONResponse({"requests": self._store.requests(scenario)})

    async def configure(self, request: Request) -> Response:
        try:
            settings = EndpointSettings.model_validate(await _control_body(request))
        except ValidationError as exc:
            return _control_error(_validation_message(exc))
        self._store.configure(settings)
        return JSONResponse(self._store.stats())

    async def stats(self, request: Request) -> Response:
        return JSONResponse(self._store.stats())


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


async def _embeddings_call(request: Request, store: ScenarioStore) -> Response:
    """Deterministic vectors (``_embeddings``), recorded under the scenario ``embeddings``."""
    record = _request_record(request, "openai") | {"scenario": EMBEDDINGS_SCENARIO}
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    inputs = body.get("input") if isinstance(body, dict) else None
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not all(isinstance(text, str) for text in inputs):
        store.record(record | {"body": body, "answer": "rejected", "status": 400})
        message = {"message": "'input' must be a string or a list of strings"}
        return JSONResponse(error_body("openai", 400, message), 400)
    store.record(record | {"body": body, "answer": "embeddings", "status": 200})
    return JSONResponse(embeddings_answer(str(body.get("model") or ""), inputs))


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
    if turn == NO_TURN_LEFT:
        return no_turn_left(draw.scenario)
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
        # Which connection carried it: tests count the connections a worker opened.
        "client_port": request.client.port if request.client else None,
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
