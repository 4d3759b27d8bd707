"""Who a call's client is, for fair shares: the peer's address, or the last element of the
header the gateway is told to trust (what the sidecar appends), cut to a bounded key."""

from __future__ import annotations

import pytest

from gateway_server.clients import MAX_CLIENT_CHARS, ClientRule
from gateway_server.config import from_args
from hangup_contract.peers import peer_host
from hangup_contract.runtime.options import ConfigError


def headers(**given: str) -> dict[str, str]:
    return {name.replace("_", "-"): value for name, value in given.items()}


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),  # aiohttp's request.remote
        ("::1", "::1"),
        ("ipv4:10.1.2.3:50123", "10.1.2.3"),  # gRPC's context.peer()
        ("ipv6:[::1]:50123", "::1"),
        ("ipv6:%5B::1%5D:50123", "::1"),  # brackets percent-encoded, as gRPC core writes them
        ("ipv6:[fe80::1%eth0]:1", "fe80::1%eth0"),
        ("unix:/run/x.sock", "unix:/run/x.sock"),
        ("", ""),
    ],
)
def test_the_peer_is_its_host_without_the_port(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_without_a_header_the_client_is_the_peer_whatever_the_request_says() -> None:
    rule = ClientRule()
    said = headers(x_forwarded_for="198.51.100.7")
    assert rule.key("ipv4:127.0.0.1:4000", said.get) == "127.0.0.1"
    assert rule.key(None, said.get) == ""


def test_behind_the_sidecar_the_client_is_the_address_it_appended() -> None:
    rule = ClientRule("x-forwarded-for")
    forged = headers(x_forwarded_for="203.0.113.1, 203.0.113.2 , 10.0.0.7")
    assert rule.key("127.0.0.1", forged.get) == "10.0.0.7"
    assert rule.key("127.0.0.1", headers().get) == "127.0.0.1"  # none: the peer
    assert rule.key("127.0.0.1", headers(x_forwarded_for="a, ").get) == "127.0.0.1"
    huge = headers(x_forwarded_for="9" * 100_000)
    assert len(rule.key("127.0.0.1", huge.get)) == MAX_CLIENT_CHARS


def test_the_flags() -> None:
    defaults = from_args([], {})
    assert defaults.client_header is None and defaults.responses_background_per_client == 100
    set_ = from_args(["--client-header", "X-Forwarded-For",
                      "--responses-background-per-client", "3"], {})  # fmt: skip
    assert set_.client_header == "X-Forwarded-For" and set_.responses_background_per_client == 3
    assert from_args([], {"HANGUP_GATEWAY_CLIENT_HEADER": " "}).client_header is None
    with pytest.raises(ConfigError, match="--responses-background-per-client"):
        from_args(["--responses-background-per-client", "-1"], {})
