"""Telling a vanished gRPC client from one that cancelled: peer strings and kernel socket tables."""

from __future__ import annotations

import ipaddress
import socket
import sys

import pytest

from proxy.grpc_peer import (
    Endpoint,
    Liveness,
    connection_liveness,
    liveness,
    parse_peer,
    parse_table,
)

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
REST = " 00000000:00000000 00:00000000 00000000 0 0 1 1 0 20 4 30 10 -1\n"
V4 = HEADER + (
    "   0: 0100007F:1F91 00000000:0000 0A"
    + REST
    + "   1: 0100007F:1F91 0100007F:D431 01"
    + REST
    + "   2: 0100007F:1F91 0100007F:D432 08"
    + REST
)
V6 = HEADER + (
    "   0: 00000000000000000000000001000000:1F91 00000000000000000000000001000000:9C40 01"
    + REST
    + "   1: 0000000000000000FFFF00000100007F:1F91 0000000000000000FFFF00000200007F:9C41 01"
    + REST
)
LOCALHOST = ipaddress.ip_address("127.0.0.1")


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("ipv4:127.0.0.1:54321", Endpoint(LOCALHOST, 54321)),
        ("ipv6:[::1]:40000", Endpoint(ipaddress.ip_address("::1"), 40000)),
        ("ipv6:[::ffff:127.0.0.1]:5", Endpoint(LOCALHOST, 5)),
        ("unix:/tmp/socket", None),
        ("ipv4:127.0.0.1", None),
        ("ipv4:not-an-address:80", None),
    ],
)
def test_peer_strings(peer: str, expected: Endpoint | None) -> None:
    assert parse_peer(peer) == expected


def test_ipv4_table_states() -> None:
    sockets = parse_table(V4)
    assert [s.state for s in sockets] == [0x0A, 0x01, 0x08]
    assert sockets[1].local == Endpoint(LOCALHOST, 0x1F91)
    assert liveness(sockets, Endpoint(LOCALHOST, 0xD431), 0x1F91) is Liveness.OPEN
    # Half-closed by the client (CLOSE_WAIT) and absent both mean it left.
    assert liveness(sockets, Endpoint(LOCALHOST, 0xD432), 0x1F91) is Liveness.GONE
    assert liveness(sockets, Endpoint(LOCALHOST, 0xD433), 0x1F91) is Liveness.GONE
    # The same client port talking to another local port is another connection.
    assert liveness(sockets, Endpoint(LOCALHOST, 0xD431), 80) is Liveness.GONE


def test_ipv6_table_with_mapped_ipv4_clients() -> None:
    sockets = parse_table(V6)
    assert sockets[0].remote == Endpoint(ipaddress.ip_address("::1"), 0x9C40)
    assert sockets[1].remote == Endpoint(ipaddress.ip_address("127.0.0.2"), 0x9C41)
    peer = parse_peer("ipv6:[::ffff:127.0.0.2]:40001")
    assert peer is not None
    assert liveness(sockets, peer, 0x1F91) is Liveness.OPEN


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_a_real_connection_is_open_until_the_client_closes_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        with accepted:
            host, client_port = client.getsockname()
            peer = f"ipv4:{host}:{client_port}"
            assert connection_liveness(peer, port) is Liveness.OPEN
            client.close()
            assert connection_liveness(peer, port) is Liveness.GONE


def test_unknown_when_the_peer_is_not_tcp() -> None:
    assert connection_liveness("unix:/run/x.sock", 1) is Liveness.UNKNOWN
