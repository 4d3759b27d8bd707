"""Is a gRPC client's TCP connection still there? Tells a cancelled call from a vanished client.

gRPC's Python server reports a client that cancelled its call (an HTTP/2 ``RST_STREAM``) and a
client whose connection went away (process killed, network cut) the same way: the handler task
is cancelled. The two deserve different reasons (``grpc_cancelled``, ``client_disconnect``), so
the relay asks the kernel: a connection that is still ``ESTABLISHED`` belongs to a client that
cancelled; one that is half-closed, closing or gone belongs to a client that left.

The answer comes from ``/proc/net/tcp`` and ``/proc/net/tcp6`` (Linux). Elsewhere, or when the
peer is not a TCP address (a Unix socket), the answer is "unknown" and the relay falls back to
``grpc_cancelled``. Parsing is separate from reading so it is tested on fixed text.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED = 0x01

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Liveness(enum.Enum):
    OPEN = "open"
    GONE = "gone"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: IPAddress
    port: int


def parse_peer(peer: str) -> Endpoint | None:
    """The address in a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``), else None."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
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


def _decode_address(text: str) -> Endpoint:
    """One ``/proc/net/tcp*`` address: hex IP in host (little-endian) 32-bit words, hex port."""
    hex_ip, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_ip)
    # Each 32-bit word is stored little-endian; reverse within words.
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address: IPAddress = (
        ipaddress.IPv4Address(ordered) if len(ordered) == 4 else ipaddress.IPv6Address(ordered)
    )
    return Endpoint(_unmapped(address), int(hex_port, 16))


@dataclass(frozen=True, slots=True)
class Socket:
    local: Endpoint
    remote: Endpoint
    state: int


def parse_table(text: str) -> list[Socket]:
    """The sockets listed in one ``/proc/net/tcp`` or ``tcp6`` table (header line skipped)."""
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        sockets.append(
            Socket(_decode_address(fields[1]), _decode_address(fields[2]), int(fields[3], 16))
        )
    return sockets


def liveness(sockets: Iterable[Socket], peer: Endpoint, local_port: int) -> Liveness:
    """OPEN when a socket from ``peer`` to ``local_port`` is established, else GONE."""
    for sock in sockets:
        if sock.remote == peer and sock.local.port == local_port:
            return Liveness.OPEN if sock.state == _ESTABLISHED else Liveness.GONE
    return Liveness.GONE


def connection_liveness(peer: str, local_port: int) -> Liveness:
    """Whether the client at ``peer`` (a gRPC peer string) is still connected to ``local_port``.

    Reads the kernel's socket tables; never raises (UNKNOWN when it cannot tell).
    """
    endpoint = parse_peer(peer)
    if endpoint is None:
        return Liveness.UNKNOWN
    sockets: list[Socket] = []
    readable = False
    for table in _PROC_TABLES:
        try:
            text = table.read_text()
        except OSError:
            continue
        readable = True
        try:
            sockets.extend(parse_table(text))
        except ValueError:
            return Liveness.UNKNOWN
    if not readable:
        return Liveness.UNKNOWN
    return liveness(sockets, endpoint, local_port)
