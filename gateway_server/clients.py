"""Who a call's client is, for fair shares (docs/security.md, "Fair shares").

A client is the address the connection came from (its host, without the port), unless the
gateway is told a header to read it from (``--client-header``). Behind the sidecar every
connection comes from 127.0.0.1, so there a client is whom the sidecar saw: the proxy appends
the address of its own client to ``X-Forwarded-For``, and the *last* element of that header is
the one no client can write. A header is trusted only when named: a client reaching the gateway
directly could write any value (and take as many shares as it names).

What is done with a client: the engine's admission queue serves clients in turn
(:mod:`gateway_server.engine.fair`) and a client holds at most ``--responses-background-per-
client`` background responses. A key is at most ``MAX_CLIENT_CHARS`` characters (longer values
are cut), so what the gateway keeps per client is small whatever a header holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hangup_contract.peers import peer_host

MAX_CLIENT_CHARS = 128
"""The longest client key kept (an IPv6 address with a zone is under 64)."""


@dataclass(frozen=True, slots=True)
class ClientRule:
    header: str | None = None
    """The header (gRPC: metadata key) naming the client, lower-case; None: the peer address."""

    def key(self, peer: str | None, header: Callable[[str], str | None]) -> str:
        """The client of a call from ``peer`` (an address, ``host:port`` or gRPC's
        ``ipv4:host:port``) whose header named ``name`` is ``header(name)``."""
        named = header(self.header) if self.header is not None else None
        last = named.rpartition(",")[2].strip() if named else ""
        return (last or peer_host(peer or ""))[:MAX_CLIENT_CHARS]
