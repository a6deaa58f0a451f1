"""Where definition files come from: a directory, or an HTTP(S) base URL with the same layout.

Both answer ``read(relative_path)`` with the file's bytes, or None when it does
not exist, and ``version(relative_paths)`` with what tells a changed file from the one
read (a directory: each file's modification time, size and inode; HTTP: None, it cannot
tell without fetching, so the cache's TTL decides). Relative paths are built by the store
from validated names only; what they lead to (links, FIFOs, devices, redirects, endless
bodies) is checked here.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx2

from worker._network import shown_url
from worker.agents._config import AGENT_NAME_PATTERN
from worker.exceptions import AgentConfigError

# A definition file larger than this is a mistake (or hostile), never a real prompt.
MAX_FILE_BYTES = 1024 * 1024
MAX_REDIRECTS = 5
# Never follow a final link, never wait for a FIFO's writer, never adopt a terminal.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class DefinitionSource(Protocol):
    @property
    def label(self) -> str:
        """Where files come from, safe to show (no credentials)."""
        ...

    def read(self, relative_path: str) -> bytes | None: ...

    def version(self, relative_paths: Sequence[str]) -> str | None: ...

    def list_agents(self) -> list[str]: ...

    def close(self) -> None: ...


def open_source(
    source: str, *, http_timeout_s: float, http_transport: httpx2.BaseTransport | None = None
) -> DefinitionSource:
    if re.match(r"^https?://", source, flags=re.IGNORECASE):
        return HttpSource(source, timeout_s=http_timeout_s, transport=http_transport)
    return DirectorySource(source)


class DirectorySource:
    """Files under a directory. Every file read must be a regular file inside it once
    links are resolved: a link to ``/proc/self/environ``, an agent directory linked
    elsewhere, a FIFO or a device is refused naming the path, and never blocks."""

    def __init__(self, root: str) -> None:
        self._root = Path(root).expanduser().absolute()
        self.label = str(self._root)
        # AGENTS_DIR may itself be a link (a deploy symlink); what is inside is what it points at.
        self._real_root = os.path.realpath(self._root)

    def read(self, relative_path: str) -> bytes | None:
        real_path = os.path.realpath(self._root / relative_path)
        self._check_inside(real_path, relative_path)
        try:
            status = os.lstat(real_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._unreadable(relative_path, exc) from None
        # Refused before opening: opening a FIFO or a device can block or act on it.
        _check_regular(status.st_mode, relative_path)
        _within_size_limit(status.st_size, relative_path)
        try:
            fd = os.open(real_path, _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: the file became a link since it was checked
            raise self._unreadable(relative_path, exc) from None
        try:
            # The file opened is the one checked: not swapped for a FIFO or a link outside.
            _check_regular(os.fstat(fd).st_mode, relative_path)
            self._check_inside(_opened_path(fd) or real_path, relative_path)
            return _within_size(_read_at_most(fd, MAX_FILE_BYTES + 1), relative_path)
        finally:
            os.close(fd)

    def version(self, relative_paths: Sequence[str]) -> str | None:
        """The files as they are now: a stat each (no read), "-" for one that is missing."""
        stamps = []
        for relative_path in relative_paths:
            try:
                status = os.stat(self._root / relative_path)
            except OSError:
                stamps.append("-")
            else:
                stamps.append(f"{status.st_mtime_ns}:{status.st_size}:{status.st_ino}")
        return " ".join(stamps)

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

    def _check_inside(self, real_path: str, relative_path: str) -> None:
        if os.path.commonpath([real_path, self._real_root]) != self._real_root:
            raise AgentConfigError(
                f"{relative_path}: resolves to {real_path}, outside AGENTS_DIR ({self.label})"
            )

    def _unreadable(self, relative_path: str, exc: OSError) -> AgentConfigError:
        return AgentConfigError(
            f"{relative_path}: cannot be read from {self.label} ({exc.strerror or exc})"
        )


class HttpSource:
    """An R2 bucket or a Git raw endpoint; a query string on the base (a token) is kept
    on every request and never shown. Redirects are followed only within the base's
    origin, and a body is read only up to the size limit."""

    def __init__(
        self, base_url: str, *, timeout_s: float, transport: httpx2.BaseTransport | None = None
    ) -> None:
        parts = urlsplit(base_url)
        self._base = parts._replace(path=parts.path.rstrip("/"), fragment="")
        self.label = shown_url(urlunsplit(self._base))
        self._origin = _origin(httpx2.URL(urlunsplit(self._base)))
        self._timeout_s = timeout_s
        self._transport = transport
        self._client: httpx2.Client | None = None
        self._client_pid = 0

    def read(self, relative_path: str) -> bytes | None:
        url = urlunsplit(self._base._replace(path=f"{self._base.path}/{relative_path}"))
        shown_url = f"{self.label}/{relative_path}"
        try:
            return self._fetch(url, shown_url)
        except httpx2.HTTPError as exc:
            raise AgentConfigError(
                f"{shown_url}: could not be fetched ({type(exc).__name__})"
            ) from None

    def version(self, relative_paths: Sequence[str]) -> str | None:
        return None

    def list_agents(self) -> list[str]:
        # Object stores and raw Git endpoints have no directory listing.
        return []

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _fetch(self, url: str, shown_url: str) -> bytes | None:
        for _ in range(MAX_REDIRECTS + 1):
            with self._http().stream("GET", url) as response:
                if response.is_redirect:
                    url = self._redirect_target(response, shown_url)
                    continue
                if response.status_code == 404:
                    return None
                if response.status_code != 200:
                    raise AgentConfigError(f"{shown_url}: HTTP {response.status_code}")
                return _read_body(response, shown_url)
        raise AgentConfigError(f"{shown_url}: more than {MAX_REDIRECTS} redirects")

    def _redirect_target(self, response: httpx2.Response, shown_url: str) -> str:
        target = response.url.join(response.headers["location"])
        if _origin(target) != self._origin:
            # Off-origin, the base's query token would be offered to whoever answers.
            raise AgentConfigError(
                f"{shown_url}: redirected to another origin "
                f"({target.scheme}://{target.host}), not followed"
            )
        return str(target)

    def _http(self) -> httpx2.Client:
        # A client (and its pooled connections) must not cross a fork into a job process.
        if self._client is None or self._client_pid != os.getpid():
            self._client = httpx2.Client(
                trust_env=False,
                timeout=self._timeout_s,
                follow_redirects=False,  # followed by hand, within the origin only
                transport=self._transport,
            )
            self._client_pid = os.getpid()
        return self._client


def _read_body(response: httpx2.Response, shown_url: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit():
        _within_size_limit(int(declared), shown_url)
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        # Stop as soon as the limit is passed, not after downloading everything.
        _within_size_limit(len(body), shown_url)
    return bytes(body)


def _origin(url: httpx2.URL) -> tuple[str, str, int | None]:
    default_port = {"http": 80, "https": 443}.get(url.scheme)
    return (url.scheme, url.host, url.port or default_port)


def _check_regular(mode: int, file: str) -> None:
    if not stat.S_ISREG(mode):
        raise AgentConfigError(f"{file}: not a regular file ({_file_kind(mode)})")


def _file_kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a link"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a file")


def _opened_path(fd: int) -> str | None:
    """Where an open file really is (Linux ``/proc``), or None where that cannot be told."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _within_size_limit(size: int, file: str) -> None:
    if size > MAX_FILE_BYTES:
        raise AgentConfigError(f"{file}: larger than {MAX_FILE_BYTES} bytes")


def _within_size(content: bytes, file: str) -> bytes:
    _within_size_limit(len(content), file)
    return content
