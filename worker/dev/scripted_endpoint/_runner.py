"""Serving the scripted endpoint: ``ScriptedEndpoint`` runs it in a background thread of
this process; ``bind_listener`` and ``server_config`` are shared with ``__main__``, which
serves it as a process of its own."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette

from worker.dev.scripted_endpoint._scenarios import (
    NO_TURN_LEFT,
    EndpointSettings,
    ScenarioStore,
    ScriptedTurn,
)
from worker.dev.scripted_endpoint._server import create_app

_READY_TIMEOUT_S = 10.0
# Open SSE streams must not hold a shutdown for long.
_GRACEFUL_SHUTDOWN_S = 2


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
