"""The upstream's gRPC address (``--upstream-grpc``): one ``host:port``, or several addresses
that serve alike, over which calls are spread.

One gRPC channel keeps one HTTP/2 connection for all its calls, so behind a port that several
processes share (a hangup gateway's API processes, ``SO_REUSEPORT``) every call of the channel
reaches the one process that accepted the connection. Given each process's own port (the
gateway's ``--grpc-process-ports``), the channel connects to each and sends calls to them in
turn (grpc's ``round_robin`` policy), skipping one that is down until it is back (tried again
at least every 5 s). Not by load: a process that is stalled but connected still gets its turn.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

import grpc


def parse_upstream_grpc(text: str) -> str:
    """``host:port`` (or one gRPC target with its scheme, such as ``unix:/path``), or several
    comma-separated ``ip:port`` of one family (IPv6 in brackets); the same text, spaces removed.
    Raises ValueError naming the bad part."""
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    if not addresses:
        raise ValueError("expected host:port")
    if len(addresses) == 1 and addresses[0].split(":", 1)[0] in _SCHEMES:
        return addresses[0]  # grpc resolves it
    families = set()
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"not host:port: {address!r}")
        if len(addresses) > 1:
            literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
            try:
                families.add(ipaddress.ip_address(literal).version)
            except ValueError:
                raise ValueError(
                    f"{address!r}: several addresses must be IP addresses (not names)"
                ) from None
            if ":" in literal and literal == host:
                raise ValueError(f"{address!r}: an IPv6 address goes in brackets")
    if len(families) > 1:
        raise ValueError("several addresses must be all IPv4 or all IPv6")
    return ",".join(addresses)


def upstream_channel(upstream: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """A channel to ``upstream`` (as :func:`parse_upstream_grpc` returns it): to several
    addresses, a connection to each and the calls spread over them."""
    if "," not in upstream:
        return grpc.aio.insecure_channel(upstream, options=list(options))
    scheme = "ipv6" if upstream.startswith("[") else "ipv4"
    return grpc.aio.insecure_channel(f"{scheme}:{upstream}", options=[*options, *_SPREAD])


_SCHEMES = {"dns", "unix", "unix-abstract", "vsock", "ipv4", "ipv6"}
"""Target schemes grpc resolves itself (its naming doc), for one address."""

_SPREAD = [
    ("grpc.lb_policy_name", "round_robin"),
    # A process that was down (a restart that loads a model takes minutes) is used again within
    # 5 s of its return, not after grpc's default backoff of up to 120 s.
    ("grpc.max_reconnect_backoff_ms", 5000),
]
