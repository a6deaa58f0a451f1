"""A real devhub (``python -m hub_client.devhub``) as a subprocess on a free port.

Use ``with running_devhub() as hub:`` in any test that needs a Hub; the process
is stopped when the block ends, also when the test fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from tests.support import SERVER_READY_TIMEOUT_S
from tests.support.redis_server import free_port


class DevHubFailedToStart(RuntimeError):
    pass


def _new_log_file() -> Path:
    descriptor, path = tempfile.mkstemp(prefix="devhub-", suffix=".log")
    os.close(descriptor)
    return Path(path)


@dataclass
class DevHub:
    port: int
    api_key: str | None
    state_file: Path | None
    process: subprocess.Popen[bytes] | None = None
    _stderr_path: Path = field(init=False, default_factory=_new_log_file)

    @property
    def url(self) -> str:
        """Base URL without ``/api/v1``: what HUB_URL and HubClient take."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """HUB_URL and HUB_API_KEY for a process that should talk to this devhub."""
        variables = {"HUB_URL": self.url}
        if self.api_key:
            variables["HUB_API_KEY"] = self.api_key
        return variables

    def state(self) -> dict[str, Any]:
        """Everything the devhub holds (GET /api/v1/_dev/state)."""
        answer = self._request("GET", "/_dev/state")
        return dict(answer)

    def reset(self) -> None:
        self._request("POST", "/_dev/reset")

    def seed_post(self, content: str, *, author: str = "alice", **fields: str) -> str:
        """A post on the Hub, as a human would write it (``title``, ``community``...); its id."""
        created = self._request(
            "POST", "/posts", json={"agent_id": author, "content": content, **fields}
        )
        return str(created["id"])

    def register_agent(
        self, agent_id: str, *, name: str | None = None, last_activated_at: str | None = None
    ) -> None:
        body: dict[str, Any] = {"id": agent_id, "name": name}
        if last_activated_at is not None:
            body["last_activated_at"] = last_activated_at
        self._request("POST", "/_dev/agents", json=body)

    def set_budget(self, agent_id: str, **overrides: Any) -> None:
        """What budget-health answers for the agent, e.g. ``healthy=False, collective=True``."""
        self._request("POST", "/_dev/budget", json={"agent_id": agent_id, **overrides})

    def inject_faults(
        self,
        status: int | None,
        count: int,
        *,
        path_prefix: str = "/api/v1",
        retry_after: float | None = None,
        method: str | None = None,
        body: str | None = None,
        content_type: str | None = None,
        delay_s: float | None = None,
    ) -> None:
        """The next ``count`` requests under ``path_prefix`` (of ``method``, when given)
        answer ``status``, with ``body`` as ``content_type`` when given, after ``delay_s``
        when given (``status`` None: the Hub's own answer, late); 0 clears."""
        fault: dict[str, Any] = {"count": count, "path_prefix": path_prefix}
        optional = {
            "status": status,
            "retry_after": retry_after,
            "method": method,
            "body": body,
            "content_type": content_type,
            "delay_s": delay_s,
        }
        fault.update({key: value for key, value in optional.items() if value is not None})
        self._request("POST", "/_dev/faults", json=fault)

    def start(self) -> None:
        command = [sys.executable, "-m", "hub_client.devhub", "--port", str(self.port)]
        if self.state_file is not None:
            command += ["--state-file", str(self.state_file)]
        # The key goes through the environment, not argv, so `ps` never shows it.
        environment = {k: v for k, v in os.environ.items() if k != "HUB_API_KEY"}
        if self.api_key:
            environment["HUB_API_KEY"] = self.api_key
        with self._stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=stderr, env=environment
            )
        self._wait_ready()

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def start_again(self) -> None:
        """Restart on the same port with the same state file (state survives only with one)."""
        self.stop()
        self.start()

    def stderr_text(self) -> str:
        try:
            return self._stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.stop()
        self._stderr_path.unlink(missing_ok=True)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _request(self, method: str, path: str, *, json: Any = None) -> Any:
        response = httpx2.request(
            method,
            f"{self.url}/api/v1{path}",
            json=json,
            headers=self._headers(),
            timeout=10,
            trust_env=False,
        )
        response.raise_for_status()
        return response.json()

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise DevHubFailedToStart(
                    f"devhub exited with {self.process.returncode}: {self.stderr_text()[-2000:]}"
                )
            try:
                httpx2.get(
                    f"{self.url}/api/v1/_dev/state",
                    headers=self._headers(),
                    timeout=1,
                    trust_env=False,
                ).raise_for_status()
                return
            except httpx2.HTTPError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise DevHubFailedToStart(
                        f"devhub on port {self.port} did not answer within "
                        f"{SERVER_READY_TIMEOUT_S}s: {self.stderr_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)


@contextmanager
def running_devhub(
    *, api_key: str | None = None, state_file: Path | None = None
) -> Iterator[DevHub]:
    """Start a devhub subprocess on a free port; stop it when the block ends."""
    hub = DevHub(port=free_port(), api_key=api_key, state_file=state_file)
    try:
        hub.start()
        yield hub
    finally:
        hub.cleanup()
