"""Where a private task's reads may go: a read that leaves the worker is a write to
whoever receives it.

A task is private when the worker knows, before the first model call, that its prompt
holds non-public data (a direct message, a private memory, a context the operator or the
definition marks private: ``worker.pipeline._scope``). Its egress then goes only where
trusted inputs point::

    fetch URL      one the person's own message contains, exactly or with the model
                   adding nothing (its query or fragment dropped); or one on the
                   operator's allowlist (EGRESS_ALLOW: a host, matched exactly, or a URL
                   prefix, matched on scheme, host, port and whole path segments)
    redirect       each hop the fetcher follows passes the same rule
    third-party    the operator's argument rule (MCP_CONFIG ``scope``) for the tool; a tool
                   without one is withheld unless its server lists it in ``private_ok``

A public task's ``Reach`` is ``Reach.anywhere()``: today's tools, unbounded. The reach
travels in the task's signed capability with its scope (claim ``scope.egress``), so
``mcp-web`` checks every hop itself. A refusal's message is trusted text only: the URL the
model composed is never echoed back to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# A URL in a message: up to the first space, quote or bracket; sentence punctuation that
# ends it is not part of it.
_URL = re.compile(r"https?://[^\s<>\"'`\[\]{}|\\^]+", re.IGNORECASE)
_TRAILING = ".,;:!?)"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class NotAUrl(ValueError):
    """The text is not an absolute http(s) URL with a host."""


@dataclass(frozen=True, slots=True)
class Address:
    """A URL as compared here: scheme and host lower-cased, default port dropped, an empty
    path as ``/``, the fragment gone (it never leaves the client)."""

    scheme: str
    host: str
    port: int | None
    path: str
    query: str

    @classmethod
    def of(cls, url: str) -> Address:
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as exc:
            raise NotAUrl(str(exc)) from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise NotAUrl("not an absolute http(s) URL")
        if parts.username is not None or parts.password is not None:
            raise NotAUrl("a URL with user info")
        return cls(
            scheme=scheme,
            host=parts.hostname.lower().rstrip("."),
            port=None if port == _DEFAULT_PORTS[scheme] else port,
            path=parts.path or "/",
            query=parts.query,
        )

    @property
    def origin(self) -> tuple[str, str, int | None]:
        return (self.scheme, self.host, self.port)

    def text(self) -> str:
        port = "" if self.port is None else f":{self.port}"
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{self.host}{port}{self.path}{query}"

    def within(self, prefix: Address) -> bool:
        """Same origin, and the path is the prefix's or below it (whole segments)."""
        if self.origin != prefix.origin:
            return False
        if prefix.path.endswith("/"):
            return self.path.startswith(prefix.path)
        return self.path == prefix.path or self.path.startswith(prefix.path + "/")


def origin_of(url: object) -> str:
    """What a report or log keeps of a refused URL: its scheme and host, never its path or
    query (where the private data would be)."""
    if not isinstance(url, str):
        return ""
    try:
        address = Address.of(url)
    except NotAUrl:
        return "(not an http(s) URL)"
    port = "" if address.port is None else f":{address.port}"
    return f"{address.scheme}://{address.host}{port}"


def urls_in(text: str) -> list[str]:
    """The http(s) URLs a message spells out, in order."""
    found = []
    for match in _URL.finditer(text):
        url = match.group(0).rstrip(_TRAILING)
        try:
            found.append(Address.of(url).text())
        except NotAUrl:
            continue
    return found


@dataclass(frozen=True, kw_only=True)
class Reach:
    """Where one task's reads may go. ``private`` False: anywhere (a public task).
    ``urls``: what the person's own message gave; ``allow``: the operator's allowlist;
    ``reasons``: why the task is private (for the log and ``check``, not the claim)."""

    private: bool = False
    urls: frozenset[str] = frozenset()
    allow: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @classmethod
    def anywhere(cls) -> Reach:
        return cls()

    def made_private(self, reason: str) -> Reach:
        """This reach, private (also) for ``reason``."""
        if reason in self.reasons:
            return self
        return Reach(
            private=True, urls=self.urls, allow=self.allow, reasons=(*self.reasons, reason)
        )

    def allows(self, url: str) -> bool:
        """Whether a read of ``url`` may leave: always in a public task; in a private one,
        only where the person's message or the operator's allowlist points."""
        if not self.private:
            return True
        try:
            address = Address.of(url)
        except NotAUrl:
            return False
        for given in self.urls:
            try:
                trusted = Address.of(given)
            except NotAUrl:
                continue
            # Exactly what the person gave, or that with its query dropped: nothing added.
            same_page = address.origin == trusted.origin and address.path == trusted.path
            if same_page and address.query in ("", trusted.query):
                return True
        for entry in self.allow:
            if "://" in entry:
                try:
                    if address.within(Address.of(entry)):
                        return True
                except NotAUrl:
                    continue
            elif address.host == entry.lower().rstrip("."):
                return True
        return False

    def refusal_message(self) -> str:
        """What the model reads: trusted text only, never the URL it composed."""
        if self.urls:
            return (
                "out of reach: this task holds private data, so it may fetch only the "
                "links the person gave in their message (as they gave them) or those "
                "the operator allows"
            )
        return (
            "out of reach: this task holds private data, so it may fetch only what the "
            "operator allows"
        )

    # -- the capability claim ----------------------------------------------------------

    def to_claim(self) -> dict[str, Any]:
        if not self.private:
            return {"private": False}
        return {"private": True, "urls": sorted(self.urls), "allow": list(self.allow)}

    @classmethod
    def from_claim(cls, claim: object) -> Reach:
        """ValueError for a claim that is not one; a private claim that is not
        well-formed never reads as public."""
        if not isinstance(claim, dict) or not isinstance(claim.get("private"), bool):
            raise ValueError("the egress claim is not an object with a boolean 'private'")
        if not claim["private"]:
            return cls.anywhere()
        urls, allow = claim.get("urls"), claim.get("allow")
        for name, value in (("urls", urls), ("allow", allow)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"the egress claim's {name} is not a list of strings")
        assert isinstance(urls, list) and isinstance(allow, list)
        return cls(private=True, urls=frozenset(urls), allow=tuple(allow))
