"""Where definition files come from: a directory, or an HTTP(S) base URL with the same layout.

Both answer ``read(relative_path)`` with the file's bytes, or None when it does
not exist. Relative paths are built by the store from validated names only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx2

from worker.agents._config import AGENT_NAME_PATTERN
from worker.exceptions import AgentConfigError

# A definition file larger than this is a mistake (or hostile), never a real prompt.
MAX_FILE_BYTES = 1024 * 1024


class DefinitionSource(Protocol):
    @property
    def label(self) -> str:
        """Where files come from, safe to show (no credentials)."""
        ...

    def read(self, relative_path: str) -> bytes | None: ...

    def list_agents(self) -> list[str]: ...

    def close(self) -> None: ...


def open_source(
    source: str, *, http_timeout_s: float, http_transport: httpx2.BaseTransport | None = None
) -> DefinitionSource:
    if re.match(r"^https?://", source, flags=re.IGNORECASE):
        return HttpSource(source, timeout_s=http_timeout_s, transport=http_transport)
    return DirectorySource(source)


class DirectorySource:
    def __init__(self, root: str) -> None:
        self._root = Path(root).expanduser().absolute()
        self.label = str(self._root)

    def read(self, relative_path: str) -> bytes | None:
        path = self._root / relative_path
        try:
            with path.open("rb") as file:
                content = file.read(MAX_FILE_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise AgentConfigError(
                f"{relative_path}: cannot be read from {self.label} ({exc.strerror or exc})"
            ) from None
        return _within_size(content, relative_path)

    def list_agents(self) -> list[str]:
        agents_dir = self._root / "agents"
        try:
            candidates = list(agents_dir.iterdir())
        except OSError:
            return []
        return sorted(
            entry.name
            for entry in candidates
            if re.fullmatch(AGENT_NAME_PATTERN, entry.name) and (entry / "config.yaml").is_file()
        )

    def close(self) -> None:
        """Nothing stays open between reads of a directory."""


class HttpSource:
    """An R2 bucket or a Git raw endpoint; a query string on the base (a token) is kept
    on every request and never shown."""

    def __init__(
        self, base_url: str, *, timeout_s: float, transport: httpx2.BaseTransport | None = None
    ) -> None:
        parts = urlsplit(base_url)
        self._base = parts._replace(path=parts.path.rstrip("/"), fragment="")
        self.label = _without_credentials(self._base)
        self._timeout_s = timeout_s
        self._transport = transport
        self._client: httpx2.Client | None = None
        self._client_pid = 0

    def read(self, relative_path: str) -> bytes | None:
        url = urlunsplit(self._base._replace(path=f"{self._base.path}/{relative_path}"))
        shown_url = f"{self.label}/{relative_path}"
        try:
            response = self._http().get(url)
        except httpx2.HTTPError as exc:
            raise AgentConfigError(
                f"{shown_url}: could not be fetched ({type(exc).__name__})"
            ) from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise AgentConfigError(f"{shown_url}: HTTP {response.status_code}")
        return _within_size(response.content, shown_url)

    def list_agents(self) -> list[str]:
        # Object stores and raw Git endpoints have no directory listing.
        return []

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _http(self) -> httpx2.Client:
        # A client (and its pooled connections) must not cross a fork into a job process.
        if self._client is None or self._client_pid != os.getpid():
            self._client = httpx2.Client(
                trust_env=False,
                timeout=self._timeout_s,
                follow_redirects=True,
                transport=self._transport,
            )
            self._client_pid = os.getpid()
        return self._client


def _within_size(content: bytes, file: str) -> bytes:
    if len(content) > MAX_FILE_BYTES:
        raise AgentConfigError(f"{file}: larger than {MAX_FILE_BYTES} bytes")
    return content


def _without_credentials(url: SplitResult) -> str:
    host = url.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if url.port is not None:
        host = f"{host}:{url.port}"
    return urlunsplit((url.scheme, host, url.path, "", ""))
