"""Which addresses the web fetcher may reach, enforced where the connection is made.

Checking a URL's host before the request is not enough: the name can resolve to a
different address a moment later (DNS rebinding), and a proxy taken from the
environment would connect somewhere else entirely. So the decisive check lives in
``VettingNetworkBackend``: it resolves the host itself, vets every address, and
connects to the vetted address, the one the connection actually uses.
``AddressPolicy.check_url`` runs first on each hop only to refuse URL tricks early
with a clear message.

Refused: loopback, private (RFC 1918, ULA), carrier-grade NAT (100.64/10),
link-local, multicast, unspecified, reserved and other non-global addresses,
cloud metadata endpoints, IPv4 hidden in IPv6 (mapped, NAT64, 6to4) when the IPv4
is refused, non-standard IPv4 spellings (``2130706433``, ``0x7f.1``) and URLs with
user info. ``MCP_WEB_ALLOW_NETWORKS`` (comma-separated CIDRs) is the operator's
escape hatch to reach chosen internal networks; cloud metadata stays refused.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import httpcore2
import httpx2

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_NETWORKS_ENV = "MCP_WEB_ALLOW_NETWORKS"

CLOUD_METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
    )
)
CLOUD_METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data"}
)

_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
# Dotted numbers where some part is hex, octal or the dots are fewer than three:
# inet_aton reads them as an IPv4 address, a browser would too, a human would not.
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*\.?$")


class AddressRefused(Exception):
    """The URL, or an address its host resolves to, is off limits; ``str()`` is for the model."""


def refusal_reason(address: IPAddress) -> str | None:
    """Why ``address`` is not a public unicast address (``"a loopback address"``), or None."""
    if address in CLOUD_METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            reason = refusal_reason(inner)
            return None if reason is None else f"{reason} (IPv4 {inner} inside IPv6)"
        if address in _SITE_LOCAL:
            return "a site-local address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in _SHARED_ADDRESS_SPACE:
        return "a carrier-grade NAT address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a public address"
    return None


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a packet to ``address`` really reaches: mapped, NAT64 or 6to4."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64_WELL_KNOWN:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressPolicy:
    """Public addresses only, plus the networks an operator explicitly allows."""

    allow_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AddressPolicy:
        """Read ``MCP_WEB_ALLOW_NETWORKS``; raise ValueError naming the variable when malformed."""
        raw = (os.environ if environ is None else environ).get(ALLOW_NETWORKS_ENV, "")
        return cls(allow_networks=parse_networks(raw))

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be reached under this policy, or None."""
        if address in CLOUD_METADATA_ADDRESSES:
            return "a cloud metadata address"
        if self._allowed(address):
            return None
        return refusal_reason(address)

    def check_address(self, address: IPAddress, *, host: str) -> None:
        """Raise AddressRefused when ``host`` (a name or literal) led to a refused ``address``."""
        reason = self.refusal(address)
        if reason is None:
            return
        if _same_address(host, address):
            raise AddressRefused(f"refused: {address} is {reason}")
        raise AddressRefused(f"refused: {host} resolves to {address}, {reason}")

    def check_url(self, url: str) -> None:
        """Refuse what can be refused from the URL alone; names are vetted again at connect."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:
            raise AddressRefused(f"refused: not a valid URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise AddressRefused(
                f"refused: only http and https URLs are fetched, not {scheme or 'a relative URL'}"
            )
        if "@" in parts.netloc:
            raise AddressRefused("refused: URLs with user info (user@host) are not fetched")
        host = (parts.hostname or "").rstrip(".")
        if not host:
            raise AddressRefused("refused: the URL has no host")
        if host in CLOUD_METADATA_HOSTS:
            raise AddressRefused(f"refused: {host} is a cloud metadata host")
        literal = _ip_literal(host)
        if literal is not None:
            self.check_address(literal, host=host)
        elif _NUMERIC_HOST.match(host):
            raise AddressRefused(f"refused: {host} is {_describe_numeric_host(host)}")

    def _allowed(self, address: IPAddress) -> bool:
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address) and (inner := embedded_ipv4(address)):
            candidates.append(inner)
        return any(
            candidate in network for candidate in candidates for network in self.allow_networks
        )


def parse_networks(raw: str) -> tuple[IPNetwork, ...]:
    """``"127.0.0.1/32, 10.1.0.0/16"`` -> networks; ValueError naming the variable if malformed."""
    networks: list[IPNetwork] = []
    for item in raw.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(
                f"{ALLOW_NETWORKS_ENV}: {item!r} is not a network (expected CIDR like 10.0.0.0/8)"
            ) from None
    return tuple(networks)


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _same_address(host: str, address: IPAddress) -> bool:
    literal = _ip_literal(host.strip("[]"))
    return literal is not None and literal == address


def _describe_numeric_host(host: str) -> str:
    try:
        decoded = ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
    except (OSError, ValueError):
        return "not a valid host name or IPv4 address"
    reason = refusal_reason(decoded)
    meaning = f"a non-standard spelling of the IPv4 address {decoded}"
    return meaning if reason is None else f"{meaning}, {reason}"


Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, in the resolver's order, without duplicates."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]))
        if address not in addresses:
            addresses.append(address)
    return addresses


class VettingNetworkBackend(httpcore2.AsyncNetworkBackend):
    """Resolve each host here, refuse it if any address is refused, connect to a vetted IP.

    Refusing the whole name when one of its addresses is refused closes the trick of
    answering one public and one private address and hoping the private one is tried.
    """

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        connector: httpcore2.AsyncNetworkBackend | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self._policy = policy
        self._connector = connector or httpcore2.AnyIOBackend()
        self._resolve = resolver or resolve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2 calls it so
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                addresses = await self._resolve(host, port)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore2.ConnectError(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise httpcore2.ConnectError(f"{host} has no address")
        for address in addresses:
            self._policy.check_address(address, host=host)
        last_error: Exception | None = None
        for address in addresses:
            try:
                return await self._connector.connect_tcp(
                    str(address),
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2 calls it so
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise AddressRefused("refused: unix sockets are not fetched")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class VettedTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport whose every connection is made by ``VettingNetworkBackend``.

    ``httpx2.AsyncHTTPTransport`` cannot take a network backend, so this wraps an
    ``httpcore2.AsyncConnectionPool`` directly. It never uses a proxy, whatever the
    environment says; give the client ``trust_env=False`` as well.
    """

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        connector: httpcore2.AsyncNetworkBackend | None = None,
        resolver: Resolver | None = None,
        max_connections: int = 20,
    ) -> None:
        backend = VettingNetworkBackend(policy, connector=connector, resolver=resolver)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            max_connections=max_connections,
            network_backend=backend,
        )

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not isinstance(request.stream, httpx2.AsyncByteStream):
            raise TypeError("VettedTransport needs an async request body")
        core_request = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpcore_errors_as_httpx2():
            core_response = await self._pool.handle_async_request(core_request)
        if not isinstance(core_response.stream, AsyncIterable):
            raise TypeError("the connection pool returned a sync body")
        return httpx2.Response(
            status_code=core_response.status,
            headers=core_response.headers,
            stream=_PoolResponseStream(core_response.stream),
            extensions=core_response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _PoolResponseStream(httpx2.AsyncByteStream):
    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpcore_errors_as_httpx2():
            async for chunk in self._chunks:
                yield chunk

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            with _httpcore_errors_as_httpx2():
                await close()


# Most specific first: the first isinstance match wins.
_HTTPCORE_TO_HTTPX2: tuple[tuple[type[Exception], type[httpx2.TransportError]], ...] = (
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
)


@contextmanager
def _httpcore_errors_as_httpx2() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core_error, httpx2_error in _HTTPCORE_TO_HTTPX2:
            if isinstance(exc, core_error):
                raise httpx2_error(str(exc)) from exc
        raise
