"""``bench.base.addresses``: the one split of a listener's address, and free ports."""

from __future__ import annotations

import socket

import pytest

from bench.base.addresses import free_ports, host_port, port_of


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("http://127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("http://localhost:8000/v1/models", ("localhost", 8000)),
        ("[::1]:9090", ("::1", 9090)),
        ("http://[::1]:9090", ("::1", 9090)),
    ],
)
def test_an_address_reads_as_a_socket_takes_it(address: str, expected: tuple[str, int]) -> None:
    assert host_port(address) == expected
    assert port_of(address) == expected[1]


@pytest.mark.parametrize("address", ["127.0.0.1", "http://localhost", "127.0.0.1:http"])
def test_an_address_without_a_port_is_refused(address: str) -> None:
    with pytest.raises(ValueError):
        host_port(address)


def test_free_ports_differ_and_can_be_bound() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
