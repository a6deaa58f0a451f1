"""Scripted turns, endpoint settings, and the store of per-scenario queues and recorded requests.

Everything here is shared by the requests the endpoint serves concurrently (and, in
process, by the test thread), so the store guards its state with one lock and never
holds it across an ``await``.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DEMO_SCENARIO = "demo"
DEFAULT_SCENARIO = "default"
# A scenario that ran out of turns answers an error (HTTP 400, an invalid request to the
# SDKs): a placeholder text would be posted to the Hub as the agent's reply, `completed`.
NO_TURN_LEFT_STATUS = 400
NO_TURN_LEFT_MESSAGE = "scripted endpoint: scenario {scenario!r} has no turn left"
# Oldest records are dropped beyond this, so a long demo run cannot grow without bound.
MAX_RECORDED_REQUESTS = 10_000

SCENARIO_MARKER = re.compile(r"\[\[scenario:([^\]\s]+)\]\]")
# Header values never recorded: only whether one was sent, and how long it was.
AUTH_HEADERS = frozenset(
    {"authorization", "x-api-key", "api-key", "proxy-authorization", "x-goog-api-key", "cookie"}
)


class _Strict(BaseModel):
    # A misspelt field in a scenario must fail loudly, not be ignored.
    model_config = ConfigDict(extra="forbid")


class ScriptedToolCall(_Strict):
    name: str = Field(min_length=1)
    # A string is sent as written, so a test can script arguments that are not valid JSON.
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class TurnUsage(_Strict):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class ScriptedTurn(_Strict):
    """One scripted answer; a ``status`` of 400 or more (or an ``error``) answers an HTTP error.

    ``dynamic`` names built-in logic that looks at the request and decides the answer.
    """

    text: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    stop_reason: Literal["end_turn", "tool_use", "max_tokens"] | None = None
    usage: TurnUsage | None = None
    status: int | None = Field(default=None, ge=200, le=599)
    headers: dict[str, str] = Field(default_factory=dict)
    error: dict[str, Any] | None = None
    delay_s: float = Field(default=0.0, ge=0)
    dynamic: Literal["demo-agent"] | None = None

    @property
    def http_status(self) -> int:
        if self.status is not None:
            return self.status
        return 500 if self.error is not None else 200

    @property
    def is_error(self) -> bool:
        return self.http_status >= 400


DEMO_AGENT_TURN = ScriptedTurn(dynamic="demo-agent")
NO_TURN_LEFT = ScriptedTurn(status=NO_TURN_LEFT_STATUS)


def no_turn_left(scenario: str) -> ScriptedTurn:
    """The error a scenario without turns answers, naming it (the failed task's error reads it)."""
    message = NO_TURN_LEFT_MESSAGE.format(scenario=scenario)
    return ScriptedTurn(status=NO_TURN_LEFT_STATUS, error={"message": message})


class StormSettings(_Strict):
    """Every model request answers ``status`` until ``until_epoch_s`` (wall clock) has passed."""

    status: int = Field(default=429, ge=400, le=599)
    until_epoch_s: float
    retry_after_s: float | None = Field(default=1.0, ge=0)


class EndpointSettings(_Strict):
    """The body of ``POST /_scripted/config``: only the fields given change."""

    latency_s: float | None = Field(default=None, ge=0)
    storm: StormSettings | None = None
    default_turn: ScriptedTurn | None = None


class ScenarioFile(_Strict):
    """``--scenario-file``: scenarios by name, plus optional settings."""

    scenarios: dict[str, list[ScriptedTurn]] = Field(default_factory=dict)
    default_turn: ScriptedTurn | None = None
    latency_s: float | None = Field(default=None, ge=0)


class AnswerKind(StrEnum):
    TURN = "turn"
    DEMO = "demo"
    DEFAULT = "default"
    STORM = "storm"


@dataclass(frozen=True, slots=True)
class Draw:
    """What a model request gets: the scenario it belongs to and the turn (or storm) to answer."""

    scenario: str
    kind: AnswerKind
    turn: ScriptedTurn | None
    storm: StormSettings | None
    latency_s: float


class ScenarioStore:
    """Queues of turns per scenario, endpoint settings, recorded requests and counters.

    ``reset`` returns to the state given at construction (scenario file, latency,
    default turn), which is an empty store unless the process was started with them.
    """

    def __init__(
        self,
        *,
        scenarios: Mapping[str, Sequence[ScriptedTurn]] | None = None,
        latency_s: float = 0.0,
        default_turn: ScriptedTurn = NO_TURN_LEFT,
    ) -> None:
        self._lock = threading.Lock()
        self._initial_scenarios = {name: list(turns) for name, turns in (scenarios or {}).items()}
        self._initial_latency_s = latency_s
        self._initial_default_turn = default_turn
        self._queues: dict[str, deque[ScriptedTurn]] = {}
        self._records: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._latency_s = latency_s
        self._default_turn = default_turn
        self._storm: StormSettings | None = None
        self._request_count = 0
        self._storm_answers = 0
        self._in_flight = 0
        self._max_concurrent = 0
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._queues = {name: deque(turns) for name, turns in self._initial_scenarios.items()}
            self._records.clear()
            self._latency_s = self._initial_latency_s
            self._default_turn = self._initial_default_turn
            self._storm = None
            self._request_count = 0
            self._storm_answers = 0
            self._max_concurrent = self._in_flight

    def set_scenario(self, name: str, turns: Iterable[ScriptedTurn]) -> None:
        """Replace the queue of scenario ``name``."""
        with self._lock:
            self._queues[name] = deque(turns)

    def configure(self, settings: EndpointSettings) -> None:
        given = settings.model_fields_set
        with self._lock:
            if "latency_s" in given:
                self._latency_s = settings.latency_s or 0.0
            if "storm" in given:
                self._storm = settings.storm
            if "default_turn" in given:
                self._default_turn = settings.default_turn or self._initial_default_turn

    def scenario_for(self, texts: Iterable[str], model: str) -> str:
        """The first ``[[scenario:NAME]]`` marker in ``texts``, else a scenario named like the
        model, else ``default``."""
        for text in texts:
            marker = SCENARIO_MARKER.search(text)
            if marker is not None:
                return marker.group(1)
        with self._lock:
            if model and (model in self._queues or model == DEMO_SCENARIO):
                return model
        return DEFAULT_SCENARIO

    def draw(self, scenario: str) -> Draw:
        """Count one model request and take its answer: a storm, the next turn, or the default."""
        with self._lock:
            self._request_count += 1
            storm = self._storm
            if storm is not None and time.time() < storm.until_epoch_s:
                self._storm_answers += 1
                return Draw(scenario, AnswerKind.STORM, None, storm, 0.0)
            queue = self._queues.get(scenario)
            if queue:
                return Draw(scenario, AnswerKind.TURN, queue.popleft(), None, self._latency_s)
            if scenario == DEMO_SCENARIO:
                return Draw(scenario, AnswerKind.DEMO, DEMO_AGENT_TURN, None, self._latency_s)
            return Draw(scenario, AnswerKind.DEFAULT, self._default_turn, None, self._latency_s)

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            entry["seq"] = (self._records[-1]["seq"] + 1) if self._records else 1
            self._records.append(entry)

    def requests(self, scenario: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            chosen = [r for r in self._records if scenario is None or r["scenario"] == scenario]
            return copy.deepcopy(chosen)

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count a model request as in flight for as long as the block runs."""
        with self._lock:
            self._in_flight += 1
            self._max_concurrent = max(self._max_concurrent, self._in_flight)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self._request_count,
                "storm_answers": self._storm_answers,
                "max_concurrent": self._max_concurrent,
                "in_flight": self._in_flight,
                "latency_s": self._latency_s,
                "storm_active": self._storm is not None and time.time() < self._storm.until_epoch_s,
                "turns_left": {name: len(queue) for name, queue in self._queues.items()},
            }

    def scenario_names(self) -> list[str]:
        with self._lock:
            return sorted({DEMO_SCENARIO, *self._queues})
