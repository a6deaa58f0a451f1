"""The web fetcher's address vetting: URL tricks, resolved addresses, and the connect path."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

import httpcore2
import httpx2
import pytest

from mcp_servers._ssrf import (
    ALLOW_NETWORKS_ENV,
    AddressPolicy,
    AddressRefused,
    IPAddress,
    VettedTransport,
    VettingNetworkBackend,
    resolve,
)
from tests.support.loopback_web import loopback_host
from tests.support.redis_server import free_port

# Every one of these must be refused, by the URL check or at connect time.
REFUSED_URLS = [
    "http://127.0.0.1/",
    "http://127.8.9.10:8080/admin",
    "http://localhost/",
    "http://[::1]/",
    "http://0.0.0.0/",
    "http://[::]/",
    "http://10.0.0.5/",
    "http://172.16.3.4/",
    "http://192.168.1.1/router",
    "http://100.64.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata.google.internal./computeMetadata/v1/",
    "http://[fe80::1]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://198.18.0.1/",
    "http://[fc00::1]/",
    "http://[fec0::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:10.1.2.3]/",
    "http://[64:ff9b::10.0.0.1]/",
    "http://[64:ff9b::127.0.0.1]/",
    "http://[2002:7f00:1::1]/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://0x7f.1/",
    "http://0177.0.0.1/",
    "http://127.1/",
    "http://0/",
    "http://example.com@127.0.0.1/",
    "http://user:secret@example.com/",
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_INFO",
    "ftp://example.com/file",
    "http:///no-host",
]


class RecordingConnector(httpcore2.AsyncNetworkBackend):
    """Stands in for the socket layer: records where a connection would have gone."""

    def __init__(self) -> None:
        self.connected_to: list[tuple[str, int]] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's signature
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        self.connected_to.append((host, port))
        return httpcore2.AsyncMockStream([])


class ScriptedResolver:
    """Answers each lookup with the next list of addresses, like a rebinding DNS server."""

    def __init__(self, *answers: list[str]) -> None:
        self._answers = [[ipaddress.ip_address(a) for a in answer] for answer in answers]
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        return self._answers.pop(0)


async def vet_like_a_fetch(
    policy: AddressPolicy, url: str, connector: RecordingConnector
) -> httpcore2.AsyncNetworkStream:
    """The checks a fetch makes: the URL first, then a real resolve + connect via the backend."""
    policy.check_url(url)
    parts = urlsplit(url)
    assert parts.hostname is not None
    backend = VettingNetworkBackend(policy, connector=connector)
    return await backend.connect_tcp(parts.hostname, parts.port or 80, timeout=5)


@pytest.mark.anyio
@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_dangerous_urls_are_refused_before_any_connection(url: str) -> None:
    connector = RecordingConnector()

    with pytest.raises(AddressRefused, match=r"^refused: "):
        await vet_like_a_fetch(AddressPolicy(), url, connector)

    assert connector.connected_to == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1/", "refused: 127.0.0.1 is a loopback address"),
        ("http://10.0.0.5/", "refused: 10.0.0.5 is a private address"),
        ("http://100.64.0.1/", "refused: 100.64.0.1 is a carrier-grade NAT address"),
        ("http://169.254.169.254/", "refused: 169.254.169.254 is a cloud metadata address"),
        ("http://[::ffff:127.0.0.1]/", "loopback address (IPv4 127.0.0.1 inside IPv6)"),
        ("http://0x7f.1/", "non-standard spelling of the IPv4 address 127.0.0.1, a loopback"),
        ("http://metadata.google.internal/", "metadata.google.internal is a cloud metadata host"),
        ("http://example.com@127.0.0.1/", "user info"),
        ("file:///etc/passwd", "only http and https URLs are fetched, not file"),
    ],
)
def test_refusals_say_why_in_words_the_model_can_read(url: str, message: str) -> None:
    with pytest.raises(AddressRefused) as refusal:
        AddressPolicy().check_url(url)

    assert message in str(refusal.value)


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert AddressPolicy().refusal(ipaddress.ip_address(address)) is None


@pytest.mark.anyio
async def test_the_connection_goes_to_the_vetted_address_not_a_second_lookup() -> None:
    # A rebinding DNS answers public first, loopback next: only one lookup may count.
    resolver = ScriptedResolver(["93.184.216.34"], ["127.0.0.1"])
    connector = RecordingConnector()
    backend = VettingNetworkBackend(AddressPolicy(), connector=connector, resolver=resolver)

    await backend.connect_tcp("rebind.example", 443, timeout=5)
    with pytest.raises(AddressRefused, match=re.escape("rebind.example resolves to 127.0.0.1")):
        await backend.connect_tcp("rebind.example", 443, timeout=5)

    assert connector.connected_to == [("93.184.216.34", 443)]
    assert resolver.lookups == ["rebind.example", "rebind.example"]


@pytest.mark.anyio
async def test_a_name_with_one_private_address_among_public_ones_is_refused() -> None:
    resolver = ScriptedResolver(["93.184.216.34", "10.0.0.7"])
    connector = RecordingConnector()
    backend = VettingNetworkBackend(AddressPolicy(), connector=connector, resolver=resolver)

    with pytest.raises(AddressRefused, match=r"mixed\.example resolves to 10\.0\.0\.7"):
        await backend.connect_tcp("mixed.example", 80, timeout=5)

    assert connector.connected_to == []


@pytest.mark.anyio
async def test_the_real_resolver_reads_numeric_hosts_as_the_addresses_they_hide() -> None:
    assert await resolve("2130706433", 80) == [ipaddress.ip_address("127.0.0.1")]


def test_allow_networks_open_only_the_listed_networks_and_never_metadata() -> None:
    policy = AddressPolicy.from_env({ALLOW_NETWORKS_ENV: "127.0.0.1/32, 169.254.0.0/16"})

    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("169.254.1.1")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.2")) == "a loopback address"
    assert policy.refusal(ipaddress.ip_address("::1")) == "a loopback address"
    assert policy.refusal(ipaddress.ip_address("169.254.169.254")) == "a cloud metadata address"


def test_no_networks_are_allowed_by_default() -> None:
    assert AddressPolicy.from_env({}).allow_networks == ()


def test_a_malformed_allow_list_names_the_variable() -> None:
    with pytest.raises(ValueError, match=f"{ALLOW_NETWORKS_ENV}: 'not-a-network'"):
        AddressPolicy.from_env({ALLOW_NETWORKS_ENV: "10.0.0.0/8,not-a-network"})


@pytest.fixture
def local_http_url() -> Iterator[str]:
    with loopback_host() as host:
        yield f"{host.url}/page/ssrf"


@pytest.mark.anyio
async def test_the_transport_refuses_loopback_at_connect_time(local_http_url: str) -> None:
    transport = VettedTransport(AddressPolicy())
    async with httpx2.AsyncClient(transport=transport, trust_env=False) as client:
        with pytest.raises(AddressRefused, match=re.escape("127.0.0.1 is a loopback address")):
            await client.get(local_http_url)


@pytest.mark.anyio
async def test_the_transport_connects_where_the_policy_allows_and_ignores_env_proxies(
    local_http_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy from the environment would connect to an address nobody vetted.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    transport = VettedTransport(AddressPolicy.from_env({ALLOW_NETWORKS_ENV: "127.0.0.1/32"}))
    async with httpx2.AsyncClient(transport=transport, trust_env=False) as client:
        response = await client.get(local_http_url)

    assert response.status_code == 200
    assert "PAGE-OK-ssrf" in response.text


@pytest.mark.anyio
async def test_connection_failures_surface_as_httpx2_errors() -> None:
    policy = AddressPolicy.from_env({ALLOW_NETWORKS_ENV: "127.0.0.1/32"})
    transport = VettedTransport(policy)
    async with httpx2.AsyncClient(transport=transport, trust_env=False) as client:
        with pytest.raises(httpx2.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/")
