"""A scripted LLM provider endpoint for tests: in a thread, or as its own process.

Use ``with running_scripted_llm() as llm:`` and point a provider at
``llm.openai_base_url`` / ``llm.anthropic_base_url`` (or pass ``llm.env`` to a worker
process). Everything goes over the endpoint's HTTP control API, so a test reads the
same in both modes; ``subprocess=True`` keeps the server out of the test process
(for a worker subprocess under load, or a test that blocks its own threads).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from subprocess import DEVNULL, Popen, TimeoutExpired
from typing import Any

import httpx2

from tests.support import SERVER_READY_TIMEOUT_S
from worker.dev.scripted_endpoint import ScriptedEndpoint

_READY_EVENT = "scripted_endpoint_ready"


class ScriptedLlmFailedToStart(RuntimeError):
    pass


class ScriptedLlm:
    """Script and inspect a running scripted endpoint at ``url``.

    ``process`` is the endpoint's process in subprocess mode (None in thread mode).
    """

    def __init__(self, url: str, process: Popen[bytes] | None = None) -> None:
        self.url = url
        self.process = process

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        # The Anthropic SDK appends /v1/messages itself.
        return self.url

    @property
    def env(self) -> dict[str, str]:
        """Base URLs for a worker process (keys are the test's choice)."""
        return {
            "OPENAI_BASE_URL": self.openai_base_url,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url,
        }

    def set_scenario(self, name: str, turns: Sequence[Mapping[str, Any]]) -> None:
        """Replace scenario ``name`` with ``turns`` (wire format: text, tool_calls, status, ...)."""
        self._call("POST", "/_scripted/scenarios", {"name": name, "turns": list(turns)})

    def requests(self, scenario: str | None = None) -> list[dict[str, Any]]:
        """Every model request recorded so far (auth header values are never kept)."""
        params = {"scenario": scenario} if scenario is not None else None
        recorded: list[dict[str, Any]] = self._call("GET", "/_scripted/requests", params=params)[
            "requests"
        ]
        return recorded

    def stats(self) -> dict[str, Any]:
        """``requests``, ``storm_answers``, ``max_concurrent`` and more."""
        answer: dict[str, Any] = self._call("GET", "/_scripted/stats")
        return answer

    def storm(
        self, status: int = 429, seconds: float = 20, retry_after_s: float | None = 1
    ) -> None:
        """Answer ``status`` to every model request for the next ``seconds``."""
        storm: dict[str, Any] = {
            "status": status,
            "until_epoch_s": time.time() + seconds,
            "retry_after_s": retry_after_s,
        }
        self.configure(storm=storm)

    def calm(self) -> None:
        """End a storm now."""
        self.configure(storm=None)

    def configure(self, **settings: Any) -> dict[str, Any]:
        """``latency_s``, ``storm`` or ``default_turn``, as ``POST /_scripted/config`` takes."""
        answer: dict[str, Any] = self._call("POST", "/_scripted/config", settings)
        return answer

    def reset(self) -> None:
        self._call("POST", "/_scripted/reset")

    def _call(
        self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> Any:
        response = httpx2.request(
            method, f"{self.url}{path}", json=body, params=params, timeout=10, trust_env=False
        )
        if response.status_code >= 400:
            raise AssertionError(
                f"{method} {path} answered {response.status_code}: {response.text}"
            )
        return response.json()


@contextmanager
def running_scripted_llm(
    *, subprocess: bool = False, latency_s: float = 0.0, scenario_file: Path | None = None
) -> Iterator[ScriptedLlm]:
    """Start a scripted endpoint on a free port; stop it when the block ends."""
    if not subprocess:
        if scenario_file is not None:
            raise ValueError("scenario_file needs subprocess=True (it is a command-line option)")
        with ScriptedEndpoint(latency_s=latency_s) as endpoint:
            yield ScriptedLlm(endpoint.url)
        return
    descriptor, log_name = tempfile.mkstemp(prefix="scripted-llm-", suffix=".log")
    os.close(descriptor)
    log_path = Path(log_name)
    command = [sys.executable, "-m", "worker.dev.scripted_endpoint", "--port", "0"]
    command += ["--latency-s", str(latency_s)]
    if scenario_file is not None:
        command += ["--scenario-file", str(scenario_file)]
    with log_path.open("wb") as log:
        process = Popen(command, stdout=DEVNULL, stderr=log)
    try:
        yield ScriptedLlm(_wait_ready(process, log_path), process)
    finally:
        _stop(process)
        log_path.unlink(missing_ok=True)


def _wait_ready(process: Popen[bytes], log_path: Path) -> str:
    deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
    while True:
        for line in log_path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == _READY_EVENT:
                return str(event["url"])
        if process.poll() is not None or time.monotonic() > deadline:
            output = log_path.read_text(errors="replace")[-2000:]
            raise ScriptedLlmFailedToStart(
                f"scripted endpoint did not start (exit {process.poll()}): {output}"
            )
        time.sleep(0.02)


def _stop(process: Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except TimeoutExpired:
        process.kill()
        process.wait()
