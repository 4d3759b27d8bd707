"""Is a gRPC client's TCP connection still there? Tells a cancelled call from a vanished client.

gRPC's Python server reports a client that cancelled its call (an HTTP/2 ``RST_STREAM``) and a
client whose connection went away (process killed, network cut) the same way: the handler task
is cancelled. The two deserve different reasons (``grpc_cancelled``, ``client_disconnect``), so
the relay asks the kernel: a connection that is still ``ESTABLISHED`` belongs to a client that
cancelled; one that is half-closed, closing or gone belongs to a client that left.

The question goes to the kernel's socket diagnostics (``NETLINK_SOCK_DIAG``, what ``ss`` uses)
as a dump filtered in the kernel to our port and the client's port. Its cost does not grow with
the number of sockets (as reading ``/proc/net/tcp`` does) but with the size of the kernel's
established-connection hash table, which the dump walks whole: the table is sized from the
host's memory, so a large GPU node pays more (figures in docs/benchmarks.md). Callers run it
off the event loop. Where netlink is unavailable (not Linux, a sandbox), or the peer is not a TCP
address, the answer is "unknown" and the relay falls back to ``grpc_cancelled``. Encoding the
query and decoding the answer are separate from the socket I/O so they are tested on bytes.

A client that cancels and closes its connection in the same instant may be seen as gone.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import struct
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_INET_DIAG_REQ_BYTECODE = 1
_BC_S_EQ = 11  # source (our) port equals
_BC_D_EQ = 12  # destination (the client's) port equals
_ESTABLISHED = 1
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, id
_OP = struct.Struct("=BBH")  # inet_diag_bc_op: code, yes, no
_ATTR = struct.Struct("=HH")  # rtattr: len, type
_MESSAGE_HEAD = struct.Struct("=BB2x")  # inet_diag_msg: family, state, timer, retrans
_PORTS = struct.Struct("!HH")  # then its id: source and destination ports, then addresses


class Liveness(enum.Enum):
    OPEN = "open"
    GONE = "gone"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: IPAddress
    port: int


@dataclass(frozen=True, slots=True)
class Socket:
    local: Endpoint
    remote: Endpoint
    state: int


def parse_peer(peer: str) -> Endpoint | None:
    """The address in a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``), else None."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return Endpoint(_unmapped(address), int(port))


def _unmapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def encode_query(family: int, local_port: int, peer_port: int, seq: int = 1) -> bytes:
    """A sock_diag dump request for TCP sockets of ``family`` from ``local_port`` to
    ``peer_port``, the ports matched in the kernel by a two-instruction filter."""
    # Each op jumps ``yes`` bytes ahead when it matches; ``no`` lands 4 bytes past the end
    # (reject). An op and its port operand take 8 bytes; the program is 16.
    program = (
        _OP.pack(_BC_S_EQ, 8, 16 + 4) + _OP.pack(0, 0, local_port)
        + _OP.pack(_BC_D_EQ, 8, 8 + 4) + _OP.pack(0, 0, peer_port)
    )  # fmt: skip
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
    body += _ATTR.pack(_ATTR.size + len(program), _INET_DIAG_REQ_BYTECODE) + program
    flags = _NLM_F_REQUEST | _NLM_F_DUMP
    return _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, flags, seq, 0) + body


def _address(family: int, raw: bytes) -> IPAddress:
    if family == socket.AF_INET:
        return ipaddress.IPv4Address(raw[:4])
    return _unmapped(ipaddress.IPv6Address(raw))


def decode_replies(data: bytes) -> tuple[list[Socket], bool]:
    """The sockets in one datagram of a sock_diag dump, and whether the dump is done.

    Raises OSError when the kernel answered with an error.
    """
    sockets: list[Socket] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if kind == _NLMSG_DONE:
            return sockets, True
        if kind == _NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + _HEADER.size)
            raise OSError(-code, "sock_diag refused the query")
        start = offset + _HEADER.size
        family, state = _MESSAGE_HEAD.unpack_from(data, start)
        sport, dport = _PORTS.unpack_from(data, start + 4)
        src, dst = data[start + 8 : start + 24], data[start + 24 : start + 40]
        local = Endpoint(_address(family, src), sport)
        sockets.append(Socket(local, Endpoint(_address(family, dst), dport), state))
        offset += (length + 3) & ~3
    return sockets, False


def liveness(sockets: list[Socket], peer: Endpoint, local_port: int) -> Liveness:
    """OPEN when a socket from ``peer`` to ``local_port`` is established, else GONE."""
    for sock in sockets:
        if sock.remote == peer and sock.local.port == local_port:
            return Liveness.OPEN if sock.state == _ESTABLISHED else Liveness.GONE
    return Liveness.GONE


def _dump(family: int, local_port: int, peer_port: int) -> list[Socket]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as netlink:
        netlink.settimeout(1.0)
        netlink.sendto(encode_query(family, local_port, peer_port), (0, 0))
        found: list[Socket] = []
        done = False
        while not done:
            sockets, done = decode_replies(netlink.recv(65536))
            found.extend(sockets)
        return found


class PeerWatch:
    """Asks the kernel whether gRPC clients are still connected; one per listener (the relay
    holds it), remembering which address family last found a client.

    Called from worker threads (the query is run off the event loop): what it remembers is one
    int, assigned whole, and a stale value only costs one query in the wrong order.
    """

    def __init__(self) -> None:
        self._family = 0  # the family whose query last found a client's socket (0: none yet)

    def liveness(self, peer: str, local_port: int) -> Liveness:
        """Whether the client at ``peer`` (a gRPC peer string) is still connected to
        ``local_port``.

        Asks the kernel (both address families: an IPv4 client of a dual-stack listener is an
        IPv6 socket); never raises (UNKNOWN when it cannot tell).
        """
        endpoint = parse_peer(peer)
        if endpoint is None or not hasattr(socket, "AF_NETLINK"):
            return Liveness.UNKNOWN
        try:
            for family in self._query_order(endpoint):
                sockets = _dump(family, local_port, endpoint.port)
                found = liveness(sockets, endpoint, local_port)
                if any(sock.remote == endpoint for sock in sockets):
                    self._family = family
                if found is Liveness.OPEN:
                    return found
        except (OSError, struct.error, ValueError):
            return Liveness.UNKNOWN
        return Liveness.GONE

    def _query_order(self, endpoint: Endpoint) -> tuple[int, int]:
        """Which family to ask first: the one that last found a client (a listener's sockets
        share one: gRPC's are IPv6 sockets even for IPv4 clients of 127.0.0.1), else the
        client's own. Each query walks the kernel's table, so asking the right family first
        halves the cost."""
        first = self._family
        if not first:
            ipv6 = isinstance(endpoint.address, ipaddress.IPv6Address)
            first = socket.AF_INET6 if ipv6 else socket.AF_INET
        return (first, socket.AF_INET6 if first == socket.AF_INET else socket.AF_INET)


def connection_liveness(peer: str, local_port: int) -> Liveness:
    """One question, with nothing remembered (``PeerWatch.liveness``)."""
    return PeerWatch().liveness(peer, local_port)


def can_tell_disconnects() -> bool:
    """Whether this host answers sock_diag queries (asked once, at the listener's start)."""
    if not hasattr(socket, "AF_NETLINK"):
        return False
    try:
        _dump(socket.AF_INET, 1, 1)
    except (OSError, struct.error, ValueError):
        return False
    return True
