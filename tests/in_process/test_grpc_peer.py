"""Telling a vanished gRPC client from one that cancelled: peer strings, the kernel's socket
diagnostics encoded and decoded byte by byte, and a real connection asked about."""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys

import pytest

from proxy.grpc import peer as grpc_peer
from proxy.grpc.peer import (
    Endpoint,
    Liveness,
    PeerWatch,
    Socket,
    connection_liveness,
    decode_replies,
    encode_query,
    liveness,
    parse_peer,
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


def test_query_bytes() -> None:
    query = encode_query(socket.AF_INET, 8081, 40000, seq=7)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", query)
    assert (length, kind, flags, seq, pid) == (len(query), 20, 0x301, 7, 0)
    family, protocol, _, _, states = struct.unpack_from("=BBBBI", query, 16)
    assert (family, protocol, states) == (socket.AF_INET, socket.IPPROTO_TCP, 0xFFFFFFFF)
    attr_len, attr_type = struct.unpack_from("=HH", query, 16 + 56)
    assert (attr_len, attr_type) == (4 + 16, 1)
    program = struct.unpack_from("=BBHBBHBBHBBH", query, 16 + 56 + 4)
    # sport == 8081 else reject; dport == 40000 else reject; then accept (end of program)
    assert program == (11, 8, 20, 0, 0, 8081, 12, 8, 12, 0, 0, 40000)


def _reply(family: int, state: int, sport: int, dport: int, src: bytes, dst: bytes) -> bytes:
    body = struct.pack("=BBBB", family, state, 0, 0) + struct.pack("!HH", sport, dport)
    body += src.ljust(16, b"\0") + dst.ljust(16, b"\0") + b"\0" * 12 + b"\0" * 20
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


def test_replies_decode_into_sockets_until_done() -> None:
    loopback = bytes([127, 0, 0, 1])
    mapped = ipaddress.IPv6Address("::ffff:127.0.0.2").packed
    data = _reply(socket.AF_INET, 1, 8081, 40000, loopback, loopback)
    data += _reply(socket.AF_INET6, 8, 8081, 40001, mapped, mapped)
    sockets, done = decode_replies(data)
    assert not done
    assert sockets == [
        Socket(Endpoint(LOCALHOST, 8081), Endpoint(LOCALHOST, 40000), 1),
        Socket(Endpoint(ipaddress.ip_address("127.0.0.2"), 8081),
               Endpoint(ipaddress.ip_address("127.0.0.2"), 40001), 8),
    ]  # fmt: skip
    assert decode_replies(struct.pack("=IHHII", 20, 3, 2, 1, 0) + b"\0" * 4) == ([], True)
    with pytest.raises(OSError, match="refused"):
        decode_replies(struct.pack("=IHHIIi", 20, 2, 0, 1, 0, -22))


def test_liveness_from_socket_states() -> None:
    client = Endpoint(LOCALHOST, 40000)
    established = Socket(Endpoint(LOCALHOST, 8081), client, 1)
    close_wait = Socket(Endpoint(LOCALHOST, 8081), client, 8)
    assert liveness([established], client, 8081) is Liveness.OPEN
    assert liveness([close_wait], client, 8081) is Liveness.GONE  # half-closed: it left
    assert liveness([], client, 8081) is Liveness.GONE
    other_host = Endpoint(ipaddress.ip_address("10.0.0.9"), 40000)
    assert liveness([established], other_host, 8081) is Liveness.GONE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="asks Linux's sock_diag")
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_real_connection_is_open_until_the_client_closes_it(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.create_server((host, 0), family=family) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection((host, port))
        accepted, _ = listener.accept()
        with accepted:
            client_port = client.getsockname()[1]
            peer = f"ipv4:{host}:{client_port}" if family == socket.AF_INET else (
                f"ipv6:[{host}]:{client_port}"
            )  # fmt: skip
            assert connection_liveness(peer, port) is Liveness.OPEN
            client.close()
            assert connection_liveness(peer, port) is Liveness.GONE


def test_unknown_when_the_peer_is_not_tcp() -> None:
    assert connection_liveness("unix:/run/x.sock", 1) is Liveness.UNKNOWN


def test_the_family_that_found_a_client_is_asked_first_next_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gRPC's sockets are IPv6 even for IPv4 clients: asking IPv4 first every time cost a
    second walk of the kernel's connection table per hang-up (4-5 ms each on a large host)."""
    asked: list[int] = []
    client = Endpoint(LOCALHOST, 40000)
    mapped = Socket(Endpoint(LOCALHOST, 8081), client, state=1)

    def dump(family: int, local_port: int, peer_port: int) -> list[Socket]:
        asked.append(family)
        return [mapped] if family == socket.AF_INET6 else []

    watch = PeerWatch()
    monkeypatch.setattr(grpc_peer, "_dump", dump)
    monkeypatch.setattr(grpc_peer.socket, "AF_NETLINK", 16, raising=False)
    assert watch.liveness("ipv4:127.0.0.1:40000", 8081) is Liveness.OPEN
    assert asked == [socket.AF_INET, socket.AF_INET6]
    asked.clear()
    assert watch.liveness("ipv4:127.0.0.1:40000", 8081) is Liveness.OPEN
    assert asked == [socket.AF_INET6]
